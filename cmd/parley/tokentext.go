package main

// TokenText is the text of one token ("" before the model has loaded): the
// server turns the legacy context array of Ollama's /api/generate back into
// text with it.
func (r *engineRef) TokenText(id int) string {
	if e := r.p.Load(); e != nil {
		return e.TokenText(id)
	}
	return ""
}
