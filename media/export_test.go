package media

// DecodeRGB is the child's decode, in process, for the fuzz target.
var DecodeRGB = decodeRGB

// Started is how many children the decoder has started.
func (s *Decoder) Started() int64 { return s.started.Load() }
