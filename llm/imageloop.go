package llm

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// Images on the decode loop. Encoding an image (the projector's forward pass) takes as long as a prompt of
// hundreds of tokens, and more on the CPU with a large projector; decoding its embeddings into the KV cache costs
// what a prompt of as many tokens costs. So the loop keeps only the decoding: an encoder goroutine encodes one
// image at a time while the loop goes on stepping every other sequence, and a sequence whose prompt has reached an
// image that is not encoded yet sits out of the steps, as one whose grammar sampler has not answered does. The
// encoder takes an image as soon as its sequence holds a slot (the slot's reuse has decided which images its KV
// cache lacks), so the encode overlaps the prompt text before the image.
//
// The encoder uses libmtmd's context and the projector's own ggml backend, never the llama context: llama.cpp's
// multimodal helper (mtmd_helper_eval_chunk_single) is exactly mtmd_encode_chunk, then
// mtmd_helper_decode_image_chunk over the output, and only the second of these calls llama_decode.

// encoder hands images to the goroutine that encodes them, one at a time: libmtmd's context takes one call at a
// time, and a second encode at once would share the same threads.
type encoder struct {
	jobs    chan *imageRun // capacity 1: the loop sends only while nothing is with the encoder
	results chan encoded   // capacity 1: one result per job
	busy    *imageRun      // the run with the encoder (owned by the loop; nil: none)
	wg      sync.WaitGroup
	// hold, set by tests before the first Generate, is called by the encoder before each encode.
	hold func()
}

// encoded is the encoder's answer for run.
type encoded struct {
	run  *imageRun
	embd []float32
	err  error
	took time.Duration
}

// startEncoder starts the encoder's goroutine; the loop's shutdown stops it.
func (e *Engine) startEncoder() {
	e.enc = &encoder{jobs: make(chan *imageRun, 1), results: make(chan encoded, 1)}
	e.enc.wg.Add(1)
	go e.encodeImages(e.enc)
}

// encodeImages is the encoder's goroutine: it encodes each run the loop sends and wakes the loop with the result,
// until the loop closes jobs.
func (e *Engine) encodeImages(enc *encoder) {
	defer enc.wg.Done()
	for run := range enc.jobs {
		if enc.hold != nil {
			enc.hold()
		}
		t0 := time.Now()
		embd, err := e.vision.encode(run)
		enc.results <- encoded{run: run, embd: embd, err: err, took: time.Since(t0)}
		e.poke()
	}
}

// poke wakes the loop from a wait on grammar samplers or the encoder, never blocking.
func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// stopEncoder ends the encoder's goroutine, waiting for the encode it is in, and frees what it held. Called by the
// loop's shutdown, after every sequence has finished, so that no encode runs once the loop is done.
func (e *Engine) stopEncoder() {
	if e.enc == nil {
		return
	}
	close(e.enc.jobs)
	e.enc.wg.Wait()
	e.takeEncoded()
}

// takeEncoded takes the encoder's result, if there is one, into its run (or frees the run, when its sequence has
// ended). Called by the loop.
func (e *Engine) takeEncoded() {
	if e.enc == nil {
		return
	}
	select {
	case r := <-e.enc.results:
		e.enc.busy = nil
		run := r.run
		run.encoding = false
		e.imagesEncoded.Add(1)
		e.encodeNanos.Add(int64(r.took))
		if run.orphaned {
			run.free()
			return
		}
		run.embd, run.err = r.embd, r.err
		if r.err != nil {
			e.log.Error("image encoding failed", zap.Error(r.err))
		}
	default:
	}
}

// releaseRuns frees a finished sequence's runs; one with the encoder is freed when it comes back. Called by the
// loop.
func releaseRuns(runs map[int]*imageRun) {
	for _, r := range runs {
		if r.encoding {
			r.orphaned = true
			continue
		}
		r.free()
	}
}

// awaitsImage reports whether seq's prompt has reached an image whose embeddings are not there yet: it waits for
// the encoder.
func awaitsImage(seq *sequence) bool {
	if seq.generated > 0 || len(seq.pending) == 0 || seq.pending[0] >= 0 {
		return false
	}
	run := seq.images[seq.pending[0]]
	return run != nil && run.embd == nil && run.err == nil
}

// stepImages decodes, for each sequence whose pending prompt starts with an encoded image, that image into its
// slot (images are not tokens, so they go in llama_decode calls of their own before the step's batch), then hands
// the encoder its next image. It returns how many sequences it finished (on an error).
func (e *Engine) stepImages() (finished int) {
	if e.vision == nil {
		return 0
	}
	e.takeEncoded()
	for _, s := range e.slots {
		seq := s.seq
		if seq == nil || seq.generated > 0 || len(seq.pending) == 0 || seq.pending[0] >= 0 {
			continue
		}
		run := seq.images[seq.pending[0]]
		var err error
		switch {
		case run == nil || len(seq.pending) < run.n:
			err = errors.New("a prompt resumes inside an image")
		case run.err != nil:
			err = run.err
		case run.embd == nil:
			continue // with the encoder, or waiting for it
		default:
			t0 := time.Now()
			err = e.vision.decodeImage(e.be.(*current).lc, run, s.id, e.posAt(s.cached, len(s.cached)), e.batch)
			e.stepNanos.Add(int64(time.Since(t0)))
		}
		if err != nil {
			e.log.Error("image evaluation failed", zap.Error(err))
			e.be.SeqRm(s.id, 0, -1)
			s.cached = s.cached[:0]
			e.finish(seq, parley.FinishError, err)
			finished++
			continue
		}
		s.cached = append(s.cached, seq.pending[:run.n]...)
		e.promptEval.Add(int64(run.n))
		e.imagesEvaluated.Add(1)
		seq.pending = seq.pending[run.n:]
	}
	e.feedEncoder()
	return finished
}

// feedEncoder hands the encoder, when it is idle, the first image not yet encoded in the pending prompt of the
// sequence that took its slot first, so that images are encoded in the order their requests started.
func (e *Engine) feedEncoder() {
	if e.enc == nil || e.enc.busy != nil {
		return
	}
	var next *imageRun
	var first time.Time
	for _, s := range e.slots {
		seq := s.seq
		if seq == nil || seq.generated > 0 || len(seq.images) == 0 || (next != nil && !seq.started.Before(first)) {
			continue
		}
		for _, t := range seq.pending {
			if t >= 0 {
				continue
			}
			if run := seq.images[t]; run != nil && run.embd == nil && run.err == nil {
				next, first = run, seq.started
				break
			}
		}
	}
	if next == nil {
		return
	}
	next.encoding = true
	e.enc.busy = next
	e.enc.jobs <- next // never blocks: the channel holds one, and nothing is with the encoder
}

// watchImageCancel makes the cancellation of seq, a sequence with images, wake the loop, which may be waiting for
// the encoder with nothing else to do. finish stops the watch.
func (e *Engine) watchImageCancel(seq *sequence) {
	if len(seq.images) > 0 {
		seq.unwatch = context.AfterFunc(seq.ctx, e.poke)
	}
}
