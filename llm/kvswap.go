package llm

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm/kvcache"
)

// This file swaps sessions' KV state out of the slots and back:
// a slot that goes to another session first saves its sequence's state
// (llama_state_seq_get_data) to a kvcache.Cache, by the session's key; when
// the session comes back (a new turn, or after a restart through the cache's
// files), its state is restored into whatever slot it gets and only the new
// tokens are evaluated. The hooks in the slot code are marked "KV swap".

// KVCacheConfig configures the swap of sessions' KV state (Config.KVCache).
// With both budgets zero nothing is saved.
type KVCacheConfig struct {
	RAMBytes  int64  // states held in memory at most, in bytes
	DiskBytes int64  // states kept in Dir at most, in bytes; they survive restarts
	Dir       string // where the files go (a folder per model and llama.cpp build is made in it)
	// MinFreeBytes is the free space the files leave on Dir's disk
	// (kvcache.Config.MinFreeBytes): below it they give way, oldest
	// first, and new states stay in RAM.
	MinFreeBytes int64
	// MaxAge: files not used for longer are removed when the cache opens,
	// in every model's folder (kvcache.Config.MaxAge); 0 keeps them.
	MaxAge time.Duration
	// Shared, when set, is the tier below RAM in place of Dir: a store
	// every replica reaches (a shared directory, Redis), so a replica
	// restores a conversation another served. Its budget is its own
	// (DiskBytes, Dir, MinFreeBytes and MaxAge are unused). With it, a
	// stateless conversation's state (a resent chat, by its key) is
	// saved like a session's, at idle and to the tier: its next turn may
	// reach any replica.
	Shared kvcache.Tier
	// SharedWait holds a reply's final event until its state is in the
	// shared tier (written, or refused for want of room or the tier being
	// down): a replica killed once a reply has ended loses nothing of it,
	// at the cost of the write's time at the end of each reply (not its
	// first token). Without it the state follows the final event within
	// milliseconds. Only with Shared.
	SharedWait bool
}

// minRestoreGain is how many more prompt tokens a saved state must hold than
// the slot's own cache before it is restored (a copy of the whole state)
// instead of evaluating them.
const minRestoreGain = 8

// Fallback reasons (Stats.KVCache.Fallbacks): a saved state that was not
// used, and the conversation evaluated again instead.
const (
	FallbackMismatch = "mismatch" // the prompt no longer continues the saved tokens (a reset, an edited history)
	FallbackCorrupt  = "corrupt"  // a truncated or corrupt file
	FallbackForeign  = "foreign"  // a file of another model, llama.cpp build or KV layout
	FallbackRead     = "read"     // the file could not be read
	FallbackRejected = "rejected" // llama.cpp refused the state
)

var fallbackReasons = []string{FallbackMismatch, FallbackCorrupt, FallbackForeign, FallbackRead, FallbackRejected}

// KVCacheStats counts the swap (Stats.KVCache).
type KVCacheStats struct {
	kvcache.Stats
	Restores       int64 // states restored into a slot
	RestoredTokens int64 // prompt tokens they spared (not evaluated)
	RestoreNanos   int64 // time spent restoring, disk reads included
	SaveNanos      int64 // time the decode loop spent copying states out
	// Waits, WaitNanos: replies whose final event waited for their state
	// to reach the shared tier (KVCacheConfig.SharedWait), and how long
	// the waits took in all: what the wait adds to the end of replies.
	Waits, WaitNanos int64
	Fallbacks        map[string]int64 // by reason (Fallback*)
	Unsaved          int64            // slots whose state changed since it was last saved (now)
}

// kvSwap is the engine's side of the swap. The cache is safe for
// concurrent use; clean is owned by the loop.
type kvSwap struct {
	cache *kvcache.Cache
	be    backend // its StateSeqSave and StateSeqRestore
	log   *zap.Logger
	disk  bool // states go to disk (or the shared tier) too: save at idle, so a crash keeps them
	// shared: the lower tier is shared by replicas; stateless
	// conversations are saved like sessions (KVCacheConfig.Shared).
	shared bool
	// wait: a finished reply's final event waits for its state to reach
	// the shared tier (KVCacheConfig.SharedWait; heldFinal).
	wait  bool
	clean []bool // by slot: its state is saved as it is now (setClean keeps unsaved)

	// unsaved counts the slots whose clean is false: the loop's idle pass
	// has work, and a reader (a test, a metric) can tell when the last
	// turn's state has left the loop.
	unsaved atomic.Int64

	// held is the keys whose state is in a slot now (written by the loop):
	// fetch reads no file for them.
	heldMu sync.Mutex
	held   map[string]bool

	restores, restoredTokens, restoreNanos, saveNanos atomic.Int64
	waits, waitNanos                                  atomic.Int64    // held final events, and their time held
	fallbacks                                         [5]atomic.Int64 // by fallbackReasons' index
}

// openKVSwap starts the swap for e, or returns nil when it is off.
func openKVSwap(cfg Config, e *Engine) (*kvSwap, error) {
	kc := cfg.KVCache
	if kc.RAMBytes <= 0 && kc.DiskBytes <= 0 && kc.Shared == nil {
		return nil, nil
	}
	id, err := stateIdentity(cfg, e.info, stateBuild(e.be.Name()))
	if err != nil {
		return nil, err
	}
	dir := kc.Dir
	if kc.DiskBytes <= 0 || kc.Shared != nil {
		dir = ""
	}
	ccfg := kvcache.Config{Dir: dir, RAMBytes: max(kc.RAMBytes, 0), DiskBytes: max(kc.DiskBytes, 0), Identity: id, Logger: e.log,
		MinFreeBytes: max(kc.MinFreeBytes, 0), MaxAge: max(kc.MaxAge, 0), Shared: kc.Shared}
	c, err := kvcache.Open(ccfg)
	if err != nil && dir != "" {
		// An unwritable folder costs the restarts their warm conversations, not the server its start.
		e.log.Warn("kv cache folder unusable: KV states are kept in RAM only", zap.String("dir", dir), zap.Error(err))
		dir, ccfg.Dir, ccfg.DiskBytes = "", "", 0
		c, err = kvcache.Open(ccfg)
	}
	if err != nil {
		return nil, err
	}
	if kc.Shared != nil {
		e.log.Info("kv states shared by replicas", zap.Stringer("tier", kc.Shared))
	}
	k := &kvSwap{cache: c, be: e.be, log: e.log, disk: dir != "" || kc.Shared != nil, shared: kc.Shared != nil, wait: kc.Shared != nil && kc.SharedWait, clean: make([]bool, max(cfg.CacheSlots, cfg.Parallel)), held: map[string]bool{}}
	for i := range k.clean {
		k.clean[i] = true // an empty slot has nothing to save
	}
	return k, nil
}

// setClean marks slot id saved (or changed), keeping the unsaved count.
func (k *kvSwap) setClean(id int, clean bool) {
	if k.clean[id] == clean {
		return
	}
	k.clean[id] = clean
	if clean {
		k.unsaved.Add(-1)
	} else {
		k.unsaved.Add(1)
	}
}

// stateIdentity names what a saved state is valid for: the model file (its
// size and a hash of its first and last MiB, which hold its metadata and
// some of its weights), the llama.cpp build, and the KV cache's layout
// (element type, flash attention's V layout, streams).
func stateIdentity(cfg Config, info parley.ModelInfo, build string) (string, error) {
	f, err := os.Open(cfg.Path)
	if err != nil {
		return "", fmt.Errorf("kv cache: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("kv cache: %w", err)
	}
	h := sha256.New()
	const span = 1 << 20
	if _, err := io.Copy(h, io.LimitReader(f, span)); err != nil {
		return "", fmt.Errorf("kv cache: %w", err)
	}
	if st.Size() > 2*span {
		if _, err := io.Copy(h, io.NewSectionReader(f, st.Size()-span, span)); err != nil {
			return "", fmt.Errorf("kv cache: %w", err)
		}
	}
	binding := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/ollama/ollama" {
				binding = m.Version
			}
		}
	}
	// One KV stream per slot unless unified: llama.cpp reads a state back
	// only into a cache of as many streams.
	streams := cfg.Parallel
	if info.Device.KVUnified {
		streams = 1
	}
	fmt.Fprintf(h, "|size=%d|build=%s|binding=%s|kv=%s|fa=%t|streams=%d|format=1",
		st.Size(), build, binding, cfg.KVCacheType, info.Device.FlashAttention, streams)
	if cfg.Projector != "" {
		// A state's image positions hold what this projector made of the image: another projector's state is
		// another model's.
		p, err := fileSample(cfg.Projector)
		if err != nil {
			return "", fmt.Errorf("kv cache: %w", err)
		}
		fmt.Fprintf(h, "|mmproj=%s", p)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// fileSample identifies a large file cheaply: the sha256 of its size, its first MiB and its last.
func fileSample(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d|", st.Size())
	const span = 1 << 20
	if _, err := io.Copy(h, io.LimitReader(f, span)); err != nil {
		return "", err
	}
	if st.Size() > 2*span {
		if _, err := io.Copy(h, io.NewSectionReader(f, st.Size()-span, span)); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// fetch returns the saved state of key for a request about to be queued,
// reading it from disk when it is not in memory (on the caller's
// goroutine, never the loop's). Nil when there is none, when a slot still
// holds the key's state (should the slot be taken before the request is
// admitted, the state it saves then is in memory: kvRestore finds it), or
// when the file failed its checks (counted and logged as a fallback).
//
// With a shared tier, another replica may have served the conversation
// since this one saved it (or since its slot took it): the tier's state is
// read when it holds more of the prompt than this replica's copy, whether
// or not a slot holds the key (kvRestore keeps the slot's cache when it
// holds as much).
func (k *kvSwap) fetch(key string, prompt []int) *kvcache.Entry {
	if k == nil || key == "" {
		return nil
	}
	if !k.shared {
		if !k.cache.Peek(key) {
			return nil
		}
		k.heldMu.Lock()
		held := k.held[key]
		k.heldMu.Unlock()
		if held {
			return nil
		}
	}
	t0 := time.Now()
	ent, err := k.cache.GetFor(key, prompt, minRestoreGain)
	switch {
	case err == nil:
		k.restoreNanos.Add(int64(time.Since(t0)))
		return ent
	case errors.Is(err, kvcache.ErrNotFound):
	case errors.Is(err, kvcache.ErrCorrupt):
		k.fallback(FallbackCorrupt)
	case errors.Is(err, kvcache.ErrForeign):
		k.fallback(FallbackForeign)
	default:
		k.fallback(FallbackRead)
		if k.shared {
			// The cache logs the tier's failures once, when it goes down.
			k.log.Debug("kv shared state not read; the conversation is evaluated again", zap.String("key", key), zap.Error(err))
		} else {
			k.log.Warn("kv cache file not read; the conversation is evaluated again", zap.String("key", key), zap.Error(err))
		}
	}
	return nil
}

func (k *kvSwap) fallback(reason string) {
	for i, r := range fallbackReasons {
		if r == reason {
			k.fallbacks[i].Add(1)
		}
	}
}

// heldFinal is the final event of a reply whose state is on its way to the
// shared tier (KVCacheConfig.SharedWait): sent, and out closed, once it is
// there. out has room for it (the event channel always keeps one place for
// the final event), so sending it never blocks.
type heldFinal struct {
	out chan parley.Event
	ev  parley.Event
	at  time.Time // when the reply ended
}

// kvHoldsFinal reports whether finish holds the final event of the reply
// that just left slot s until the slot's state is in the shared tier: the
// state is a conversation's (a key), it changed, and it goes to the tier.
// Called by the loop.
func (e *Engine) kvHoldsFinal(s *slot) bool {
	k := e.kv
	return k != nil && k.wait && s.key != "" && !k.clean[s.id]
}

// kvRelease returns what sends slot s's held final events (nil when it
// holds none) and takes them from the slot. Called by the loop.
func (e *Engine) kvRelease(s *slot) func() {
	finals := s.finals
	s.finals = nil
	if len(finals) == 0 {
		return nil
	}
	k := e.kv
	return func() {
		for _, f := range finals {
			k.waits.Add(1)
			k.waitNanos.Add(int64(time.Since(f.at)))
			f.out <- f.ev
			close(f.out)
		}
	}
}

// kvTakeover is assign's hook before slot s goes to the session key: the
// state of the session leaving it is saved (and, should the loop not have
// saved the slot since its reply ended, the reply's held final event
// follows that save). Called by the loop.
func (e *Engine) kvTakeover(s *slot, key string) {
	k := e.kv
	if k == nil {
		return
	}
	if len(s.finals) > 0 {
		e.kvSave(s)
	}
	if s.key == key {
		return
	}
	e.kvSave(s)
	k.heldMu.Lock()
	delete(k.held, s.key)
	if key != "" {
		k.held[key] = true
	}
	k.heldMu.Unlock()
}

// kvSave copies slot s's state into the cache under its key, unless it is
// saved already, holds nothing or belongs to no session. The final events
// the slot holds are sent once the state is in the lower tier (or at once
// when it does not go there). Called by the loop.
func (e *Engine) kvSave(s *slot) {
	release := e.kvRelease(s)
	if !e.kvSaveThen(s, release) && release != nil {
		release()
	}
}

// kvSaveThen is kvSave; it reports whether the cache took written, to call
// once the state is in the lower tier. Called by the loop.
func (e *Engine) kvSaveThen(s *slot, written func()) bool {
	k := e.kv
	if k == nil {
		return false
	}
	if s.stateless && !k.shared {
		// A stateless conversation's state goes to RAM, when its slot
		// goes to another: a client that resends it finds it warm, but it
		// never reaches the disk, which only sessions use.
		if s.ramDirty && s.key != "" && len(s.cached) > 0 {
			e.kvCopyOut(s, true, nil)
		}
		s.ramDirty = false
		return false
	}
	if k.clean[s.id] {
		return false
	}
	if s.key != "" && len(s.tail) > 0 {
		t0 := time.Now()
		e.kvDecodeTail(s)
		k.saveNanos.Add(int64(time.Since(t0))) // part of what a save costs
	}
	if s.key == "" || len(s.cached) == 0 {
		k.setClean(s.id, true) // nothing of a session's to keep
		return false
	}
	if !e.kvCopyOut(s, false, written) {
		return false
	}
	k.setClean(s.id, true)
	return true
}

// kvCopyOut copies slot s's state into the cache under its key (ramOnly:
// never to disk) and reports whether it did; the cache calls written (unless
// nil) once the state is in the lower tier (kvcache.Cache.PutThen). Called
// by the loop.
func (e *Engine) kvCopyOut(s *slot, ramOnly bool, written func()) bool {
	k := e.kv
	t0 := time.Now()
	state, err := k.be.StateSeqSave(s.id)
	if err == nil && len(state) == 0 {
		err = errors.New("llama.cpp has no state for the sequence")
	}
	k.saveNanos.Add(int64(time.Since(t0)))
	if err != nil {
		k.log.Warn("kv state not saved", zap.String("key", s.key), zap.Int("slot", s.id), zap.Error(err))
		return false
	}
	k.cache.PutThen(&kvcache.Entry{Key: s.key, Tokens: append([]int(nil), s.cached...), State: state, RAMOnly: ramOnly}, written)
	e.log.Debug("kv state saved", zap.String("key", s.key), zap.Int("slot", s.id), zap.Int("tokens", len(s.cached)),
		zap.Int("bytes", len(state)), zap.Bool("ram_only", ramOnly), zap.Duration("took", time.Since(t0)))
	return true
}

// kvDecodeTail decodes slot s's tail (the reply's last token, sampled and
// never decoded) into its cache, so that the state saved next ends with the
// whole reply. Without it the state would stop one token short of the
// conversation's text, and after a restart the chat layer, which builds the
// next prompt from the saved tokens, would have to tokenize that token's
// text (often the middle of a word) as the start of the new text: a
// continuation the tokenizer refuses, and the turn would be evaluated in
// full. It costs one token's decode, at idle or when the slot is taken
// over, and the next turn evaluates one token less. Called by the loop,
// between steps.
func (e *Engine) kvDecodeTail(s *slot) {
	tail := s.tail
	s.tail = s.tail[:0]
	if len(s.cached)+len(tail) >= e.nCtx-1 {
		return // the context's last position: a longer state would not be restored anyway
	}
	b := newBatch(len(tail))
	pos := e.posAt(s.cached, len(s.cached))
	for i, tok := range tail {
		b.add(tok, pos+i, s.id, false)
	}
	if err := e.be.Decode(b); err != nil {
		// The slot's cache is unknown now: forget it, as a failed step does.
		e.be.SeqRm(s.id, 0, -1)
		s.cached = s.cached[:0]
		e.log.Warn("the reply's last token was not decoded; the slot's cache is dropped", zap.String("key", s.key),
			zap.Int("slot", s.id), zap.Error(err))
		return
	}
	s.cached = append(s.cached, tail...)
}

// kvIdlePause is how long the loop, with nothing to decode, waits for the
// next request before it saves the states that changed (KV swap with a
// disk). A client that answers at once (a tool loop, a resend, a benchmark)
// is then served before the save instead of after it: the copy out of
// llama.cpp took 8.7 ms per turn of an 874-token F16 135M conversation on a
// CPU, and on an H200 it put a 1B model's turn-10 TTFT at 31 ms against 13 at
// turn 1 (one session) and at 775 ms against 196 (64 sessions, each idle
// moment saving every changed slot).
const kvIdlePause = 50 * time.Millisecond

// kvIdle is the loop's idle pass when states go to disk: after kvIdlePause
// with no request, it saves the changed slots one at a time, and stops as
// soon as a request arrives, which it returns (a request waits for one
// slot's copy at most). A crash or a kill loses only what was generated
// under load since the last idle moment.
func (e *Engine) kvIdle() *sequence {
	k := e.kv
	if k == nil || !k.disk || k.unsaved.Load() == 0 {
		return nil
	}
	t := time.NewTimer(kvIdlePause)
	defer t.Stop()
wait:
	for {
		select {
		case <-e.queue.signal:
			if seq := e.queue.pop(); seq != nil {
				return seq
			}
			// A signal for a request the loop admitted already: keep
			// waiting, or the states would stay unsaved until the next.
		case <-e.closing:
			return nil // the loop's select sees it (and shutdown saves)
		case <-t.C:
			break wait
		}
	}
	var next *sequence
	e.kvSaveIdle(func() bool {
		next = e.queue.pop()
		return next != nil
	})
	return next
}

// kvSaveIdle saves the state of every idle slot that changed since its last
// save, one slot at a time, when states go to disk; it stops early when
// interrupted (nil: never) says so after a slot. The loop's idle pass
// (kvIdle) stops for a request; shutdown saves them all, so that a restart
// finds every conversation warm.
func (e *Engine) kvSaveIdle(interrupted func() bool) {
	if e.kv == nil || !e.kv.disk {
		return
	}
	for _, s := range e.slots {
		if s.seq != nil || (s.stateless && !e.kv.shared) {
			continue // a stateless slot is kept (in RAM) only when it is taken over, unless replicas share states
		}
		e.kvSave(s)
		if interrupted != nil && interrupted() {
			return
		}
	}
}

// kvSaveFinished saves, with a shared tier, the state of every slot whose
// sequence just ended (between steps, after collect and after a step): the
// next turn may reach another replica at once, and a replica killed under
// load keeps every finished turn, where the idle pass alone would wait for
// a quiet moment; with SharedWait the replies' final events follow the
// writes. It costs the loop one copy of the state per turn (and the decode
// of the reply's last token). Called by the loop.
func (e *Engine) kvSaveFinished() {
	k := e.kv
	if k == nil || !k.shared || k.unsaved.Load() == 0 {
		return
	}
	for _, s := range e.slots {
		if s.seq == nil {
			e.kvSave(s)
		}
	}
}

// kvRestore is assign's hook, once s is seq's slot and keep prompt tokens
// are in its cache: when seq's saved state holds more of the prompt, it
// replaces the slot's cache. It returns how many prompt tokens the slot
// now holds.
func (e *Engine) kvRestore(s *slot, seq *sequence, keep int) int {
	k := e.kv
	if k == nil {
		return keep
	}
	// The slot's cache changes from here on.
	if seq.stateless && !k.shared {
		k.setClean(s.id, true) // nothing for the idle pass
		s.ramDirty = true
	} else {
		k.setClean(s.id, false)
	}
	toks := seq.req.Tokens
	ent := seq.restore
	seq.restore = nil
	if seq.req.Key != "" {
		// Saved after fetch (its slot was taken meanwhile, or the turn
		// before ended after it): the newer copy in memory wins.
		if m := k.cache.GetMemory(seq.req.Key); m != nil && (ent == nil || commonPrefix(m.Tokens, toks) > commonPrefix(ent.Tokens, toks)) {
			ent = m
		}
	}
	if ent == nil {
		return keep
	}
	p := commonPrefix(ent.Tokens, toks)
	if len(ent.Tokens) >= e.nCtx {
		p = 0 // saved with a larger --ctx: it does not fit the slot
	}
	if p < keep+minRestoreGain {
		if p < len(ent.Tokens) && keep < len(ent.Tokens) && p < minReusePrefix {
			k.fallback(FallbackMismatch)
			e.log.Info("saved kv state does not match the prompt; it is evaluated again", zap.String("key", seq.req.Key),
				zap.Int("saved_tokens", len(ent.Tokens)), zap.Int("matching", p))
		}
		return keep
	}
	t0 := time.Now()
	if err := e.loadState(s, ent.State, ent.Tokens); err != nil {
		k.fallback(FallbackRejected)
		e.log.Warn("saved kv state refused by llama.cpp; the conversation is evaluated again", zap.String("key", seq.req.Key),
			zap.Int("slot", s.id), zap.Error(err))
		return 0
	}
	k.restores.Add(1)
	k.restoredTokens.Add(int64(p - keep))
	k.restoreNanos.Add(int64(time.Since(t0)))
	e.log.Debug("kv state restored", zap.String("key", seq.req.Key), zap.Int("slot", s.id), zap.Int("tokens", p),
		zap.Duration("took", time.Since(t0)))
	return p
}

// loadState replaces slot s's KV cache with state, llama.cpp's per-sequence
// state of toks (which replaces the sequence's cells): the KV swap's saved
// states and a stepped-out sequence's own (swapIn). On an error the slot
// holds nothing.
func (e *Engine) loadState(s *slot, state []byte, toks []int) error {
	s.cached = s.cached[:0]
	if err := e.be.StateSeqRestore(s.id, state); err != nil {
		e.be.SeqRm(s.id, 0, -1)
		return err
	}
	s.cached = append(s.cached, toks...)
	return nil
}

// kvStats returns the swap's counters.
func (e *Engine) kvStats() KVCacheStats {
	k := e.kv
	if k == nil {
		return KVCacheStats{}
	}
	st := KVCacheStats{Stats: k.cache.Stats(), Restores: k.restores.Load(), RestoredTokens: k.restoredTokens.Load(),
		RestoreNanos: k.restoreNanos.Load(), SaveNanos: k.saveNanos.Load(), Waits: k.waits.Load(), WaitNanos: k.waitNanos.Load(), Fallbacks: map[string]int64{}, Unsaved: k.unsaved.Load()}
	for i, r := range fallbackReasons {
		st.Fallbacks[r] = k.fallbacks[i].Load()
	}
	return st
}

// kvClose flushes the cache's writes. After the loop has ended.
func (e *Engine) kvClose() {
	if e.kv != nil {
		e.kv.cache.Close()
	}
}

// SavedTokens returns the tokens of key's saved KV state, each with its
// text, in order (nil when there is none): what a restored slot will hold.
// A chat.Responder that no longer remembers the conversation (after a
// restart) builds the next prompt from them, so that the prompt continues
// the saved state token for token.
func (e *Engine) SavedTokens(key string) []parley.Token {
	if e.kv == nil || key == "" {
		return nil
	}
	t0 := time.Now()
	ids := e.kv.cache.Tokens(key)
	if e.kv.shared && len(ids) > 0 {
		// With a shared tier this reads the state the restore will use
		// (kvcache.Cache.Tokens): its time is the restore's.
		e.kv.restoreNanos.Add(int64(time.Since(t0)))
	}
	if len(ids) == 0 || slices.ContainsFunc(ids, func(id int) bool { return id < 0 }) {
		// None, or a state that holds an image (its positions are pseudo ids, no tokens): the caller renders the
		// conversation, images and all, and the engine still restores the state by its common prefix.
		return nil
	}
	out := make([]parley.Token, len(ids))
	for i, id := range ids {
		out[i] = parley.Token{ID: id, Text: e.TokenText(id), Special: e.vocab.special(id)}
	}
	return out
}
