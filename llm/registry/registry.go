// Package registry keeps the models a server serves when it serves several:
// which are loaded, which are loading, and which to unload to make room. A
// model loads on its first request (waiters queue, boundedly, and see the
// load's progress), stays while replies use it (a reference count: an
// unload never cuts a reply in flight), and unloads once idle past its
// keep-alive, or earlier, least recently used first, when another model
// needs its place under the cap on loaded models or the memory budget.
// Pinned models never unload on their own.
//
// The package knows nothing about llama.cpp: a Loader opens a model and the
// registry only counts, orders and closes what it returns. It is pure Go, so
// its policy is tested without a model.
package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// State is where a model is in its lifetime.
type State string

// A model's states. Loading and Unloading models count against the cap and
// the budget until they are Loaded or Unloaded.
const (
	Unloaded  State = "unloaded"
	Loading   State = "loading"
	Loaded    State = "loaded"
	Unloading State = "unloading"
)

// Defaults for Config's zero values.
const (
	DefaultMaxWaiting = 64                     // requests that may wait for one model's load
	DefaultKeepAlive  = 5 * time.Minute        // Ollama's default
	reapEvery         = 250 * time.Millisecond // how often expired keep-alives are looked for: the keep-alive's granularity
	// DefaultResidencyFactor: with Config.MinResidency < 0, a model stays at
	// least this many times its own last load time before it may be
	// unloaded for another model's room (a load is only worth paying for if
	// the model then serves for a while: this bounds loads to about one per
	// factor+1 load times under any alternation of requests).
	DefaultResidencyFactor = 3
	maxAutoResidency       = time.Minute            // the automatic minimum residency's ceiling
	progressEvery          = 200 * time.Millisecond // how often a waiter is shown the load's progress
)

// Spec is one model the registry may load.
type Spec struct {
	Name string
	// Estimate is the memory the model takes once loaded, in bytes (its
	// weights and KV cache); 0 when unknown. The budget is kept with it:
	// a model whose estimate is over the whole budget is refused before
	// it loads.
	Estimate int64
	// EstimateDetail says what Estimate is made of, for the refusal's
	// message (for example "file 120 MiB + KV cache 8 MiB").
	EstimateDetail string
	// Pin keeps the model loaded once it is: it is never unloaded for
	// room or for its keep-alive (an admin's Unload still unloads it).
	Pin bool
	// KeepAlive is how long the model stays loaded after its last reply
	// when a request does not say (nil: Config.KeepAlive). 0 unloads it
	// when it becomes idle; < 0 keeps it until it must make room.
	KeepAlive *time.Duration
}

// Model is a loaded model. Close frees it; the registry calls it once, when
// no reply uses the model. A Model with a LogFields() []zap.Field method
// adds those fields to the "model loaded" log line.
type Model interface {
	Close(ctx context.Context) error
}

// Loader opens the named model, telling progress the fraction loaded (0
// to 1) as it goes. ctx ends when the registry closes.
type Loader func(ctx context.Context, name string, progress func(float64)) (Model, error)

// KeepAlivePolicy says what a request's keep-alive (Ollama's keep_alive)
// may do to the model it names, which other users share.
type KeepAlivePolicy int

const (
	// KeepAliveExtend (the default): a request's keep-alive may lengthen
	// how long the model stays after that request's reply (negative: until
	// it must make room), never shorten the model's configured keep-alive:
	// keep_alive 0 unloads nothing. One user cannot unload a model that
	// others use, or leave it with a shorter keep-alive for them.
	KeepAliveExtend KeepAlivePolicy = iota
	// KeepAliveObey is Ollama's behaviour: the request's keep-alive becomes
	// the model's (0 unloads it when idle), for every later request too.
	// For a server with one trusted user.
	KeepAliveObey
	// KeepAliveIgnore: requests' keep-alives change nothing.
	KeepAliveIgnore
)

// ParseKeepAlivePolicy reads "extend", "obey" or "ignore".
func ParseKeepAlivePolicy(s string) (KeepAlivePolicy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "extend", "":
		return KeepAliveExtend, nil
	case "obey":
		return KeepAliveObey, nil
	case "ignore":
		return KeepAliveIgnore, nil
	}
	return 0, fmt.Errorf("want extend, obey or ignore, got %q", s)
}

func (p KeepAlivePolicy) String() string {
	switch p {
	case KeepAliveObey:
		return "obey"
	case KeepAliveIgnore:
		return "ignore"
	}
	return "extend"
}

// Config configures a Registry.
type Config struct {
	// MaxLoaded caps the models loaded (and loading) at once; 0 = no cap.
	MaxLoaded int
	// MemoryBudget caps the sum of loaded models' estimates, in bytes; 0 =
	// no budget.
	MemoryBudget int64
	// KeepAlive is the default keep-alive (see Spec.KeepAlive): 0 unloads
	// a model as soon as it is idle, a negative value keeps models until
	// they must make room (DefaultKeepAlive is Ollama's 5 minutes).
	KeepAlive time.Duration
	// ClientKeepAlive is what a request's keep-alive may do (the zero
	// value: KeepAliveExtend).
	ClientKeepAlive KeepAlivePolicy
	// MinResidency is how long a loaded model stays at least before it may
	// be unloaded to make room for another (load/unload thrash damping: a
	// request for another model waits in that model's queue meanwhile).
	// 0 = none; < 0 = DefaultResidencyFactor times the model's own last
	// load time, at most a minute. An admin's Unload and the model's own
	// keep-alive are not held back by it.
	MinResidency time.Duration
	// MaxWaiting bounds the requests that wait for one model's load;
	// past it they are refused with busy (DefaultMaxWaiting when 0).
	MaxWaiting int
	// Default is the model a request that names none gets ("" = the first
	// spec).
	Default string
	Logger  *zap.Logger
}

// Registry is the set of models and their residency. It is safe for
// concurrent use.
type Registry struct {
	cfg   Config
	load  Loader
	log   *zap.Logger
	names []string // in Spec order

	ctx    context.Context // the loads' and unloads'; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // loads, unloads and the reaper

	mu      sync.Mutex
	entries map[string]*entry
	closed  bool
	// freed is closed (and replaced) whenever a lease is released or a
	// model changes state: what a request waiting for room waits on.
	freed chan struct{}
	// roomWaiters counts the requests waiting on freed; while there are
	// any, the reaper wakes them at each tick, since a model's minimum
	// residency ends with time, not with an event.
	roomWaiters int
}

// entry is one model's residency; guarded by Registry.mu.
type entry struct {
	spec      Spec
	state     State
	model     Model
	refs      int           // leases held: replies in flight
	waiting   int           // requests waiting for the load
	lastUsed  time.Time     // when a lease was last taken or released
	keepAlive time.Duration // the spec's (or, with KeepAliveObey, the last request's)
	holdUntil time.Time     // KeepAliveExtend: the latest expiry a request asked for
	holdEver  bool          // KeepAliveExtend: a request asked to keep it until it must make room
	loadedAt  time.Time     // when its last load ended
	expires   time.Time     // when an idle model unloads; zero: not scheduled
	drop      bool          // unload as soon as the last lease is released
	progress  float64       // of the load in progress
	gen       int           // loads started
	loadErr   error         // the error of load gen, nil when it loaded
	loadTime  time.Duration // of the last load that succeeded
	changed   chan struct{} // closed (and replaced) at every change of state
}

// Status is what Status reports of one model.
type Status struct {
	Name           string
	State          State
	Default        bool
	Pinned         bool
	Estimate       int64
	EstimateDetail string
	KeepAlive      time.Duration // what applies once it is idle (< 0: forever)
	ExpiresAt      time.Time     // zero unless loaded and expiring; in use: now plus its keep-alive, the soonest it can go
	InFlight       int
	Waiting        int
	Progress       float64 // of a load in progress
	LoadTime       time.Duration
	LastError      string // why its last load failed; "" when it did not
	Model          Model  // the loaded model; nil unless Loaded
}

// New returns a Registry over specs (names must be unique and not empty)
// that opens models with load. Close it to unload every model.
func New(specs []Spec, load Loader, cfg Config) (*Registry, error) {
	if len(specs) == 0 {
		return nil, errors.New("models: none configured")
	}
	if cfg.MaxWaiting <= 0 {
		cfg.MaxWaiting = DefaultMaxWaiting
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	r := &Registry{cfg: cfg, load: load, log: cfg.Logger, entries: make(map[string]*entry, len(specs)), freed: make(chan struct{})}
	for _, sp := range specs {
		if sp.Name == "" {
			return nil, errors.New("models: a model without a name")
		}
		if _, dup := r.entries[sp.Name]; dup {
			return nil, fmt.Errorf("models: %q is configured twice", sp.Name)
		}
		ka := cfg.KeepAlive
		if sp.KeepAlive != nil {
			ka = *sp.KeepAlive
		}
		r.entries[sp.Name] = &entry{spec: sp, state: Unloaded, keepAlive: ka, changed: make(chan struct{})}
		r.names = append(r.names, sp.Name)
	}
	if cfg.Default == "" {
		r.cfg.Default = specs[0].Name
	} else if _, ok := r.entries[cfg.Default]; !ok {
		return nil, fmt.Errorf("models: the default model %q is not configured", cfg.Default)
	}
	if cfg.MemoryBudget > 0 {
		for _, sp := range specs {
			if sp.Pin && sp.Estimate > cfg.MemoryBudget {
				return nil, fmt.Errorf("models: %q is pinned but %s", sp.Name, tooLarge(sp, cfg.MemoryBudget))
			}
		}
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(1)
	go r.reap()
	return r, nil
}

// Names returns the models' names in configuration order.
func (r *Registry) Names() []string { return slices.Clone(r.names) }

// Default returns the name of the default model.
func (r *Registry) Default() string { return r.cfg.Default }

// Resolve returns the configured name name stands for: "" is the default
// model; names match case-insensitively and an Ollama tag ":latest" is
// ignored. Any other name is a parley ENotFound error that lists the
// models served.
func (r *Registry) Resolve(name string) (string, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return r.cfg.Default, nil
	}
	if _, ok := r.entries[name]; ok {
		return name, nil
	}
	bare := strings.TrimSuffix(strings.ToLower(name), ":latest")
	for _, n := range r.names {
		if strings.EqualFold(n, name) || strings.ToLower(n) == bare {
			return n, nil
		}
	}
	return "", parley.Errorf(parley.ENotFound, "model %q not found; this server serves %s", name, strings.Join(r.names, ", "))
}

// Lease is a model held for a reply: it is not unloaded until Release.
type Lease struct {
	r     *Registry
	e     *entry
	model Model
	once  sync.Once
	// keep is the request's keep-alive (KeepAliveExtend applies it at
	// Release); hasKeep says whether the request set one.
	keep    time.Duration
	hasKeep bool
}

// Model returns the leased model.
func (l *Lease) Model() Model { return l.model }

// Release gives the model back; its keep-alive starts when no lease is
// left. Release is idempotent.
func (l *Lease) Release() { l.once.Do(func() { l.r.release(l) }) }

// Acquire returns the named model (see Resolve), loading it first when it
// is not loaded: the request waits in the model's bounded queue (busy
// past Config.MaxWaiting), and progress (nil: none) is shown the load's
// progress. keepAlive, the request's (nil: none), applies to the model as
// Config.ClientKeepAlive allows. A model that cannot be loaded is an error for this model
// alone: too large for the budget (too_large, with the figures), no room
// because every other model is in use or pinned (busy), or the loader's
// error (unavailable, naming the model).
func (r *Registry) Acquire(ctx context.Context, name string, keepAlive *time.Duration, progress parley.LoadProgress) (*Lease, error) {
	name, err := r.Resolve(name)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	e := r.entries[name]
	waitedGen := -1 // the load this request waited for
	for {
		if r.closed {
			r.mu.Unlock()
			return nil, parley.Errorf(parley.EUnavailable, "the server is shutting down")
		}
		switch e.state {
		case Loaded:
			e.refs++
			e.lastUsed, e.expires = time.Now(), time.Time{}
			l := &Lease{r: r, e: e, model: e.model}
			if keepAlive != nil {
				ka := *keepAlive
				switch r.cfg.ClientKeepAlive {
				case KeepAliveObey:
					e.keepAlive = ka
				case KeepAliveExtend:
					l.keep, l.hasKeep = ka, true
					e.hold(ka, e.lastUsed) // shown while in use; renewed at Release
				}
			}
			r.mu.Unlock()
			return l, nil
		case Unloaded:
			if waitedGen >= 0 && e.gen == waitedGen && e.loadErr != nil {
				err := e.loadErr
				r.mu.Unlock()
				return nil, err
			}
			err := r.startLoad(e)
			if err == nil {
				continue
			}
			if !errors.Is(err, errRoomLater) {
				r.mu.Unlock()
				return nil, err
			}
			// The room is held by replies in flight (or models loading or
			// unloading, or loaded too recently to unload): wait for it, in
			// the model's queue.
			if e.waiting >= r.cfg.MaxWaiting {
				r.mu.Unlock()
				return nil, err
			}
			e.waiting++
			r.roomWaiters++
			ch := r.freed
			r.mu.Unlock()
			var waitErr error
			select {
			case <-ch:
			case <-ctx.Done():
				waitErr = fmt.Errorf("wait for room to load model %q: %w", name, ctx.Err())
			}
			r.mu.Lock()
			e.waiting--
			r.roomWaiters--
			if waitErr != nil {
				r.mu.Unlock()
				return nil, waitErr
			}
			continue
		}
		// Loading or Unloading: wait for the change.
		if e.waiting >= r.cfg.MaxWaiting {
			r.mu.Unlock()
			return nil, parley.Errorf(parley.EBusy, "%d requests already wait for model %q to load; try again shortly", e.waiting, name)
		}
		if e.state == Loading {
			waitedGen = e.gen
		}
		e.waiting++
		ch := e.changed
		r.mu.Unlock()
		err := r.wait(ctx, e, ch, progress)
		r.mu.Lock()
		e.waiting--
		if err != nil {
			r.scheduleIdle(e) // a load no one waits for any more: its keep-alive runs
			r.mu.Unlock()
			return nil, err
		}
	}
}

// TryAcquire is Acquire for a model that is loaded now: it never loads or
// waits, and reports false when the model is not loaded (or not served).
func (r *Registry) TryAcquire(name string) (*Lease, bool) {
	name, err := r.Resolve(name)
	if err != nil {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[name]
	if e.state != Loaded || r.closed {
		return nil, false
	}
	e.refs++
	e.lastUsed, e.expires = time.Now(), time.Time{}
	return &Lease{r: r, e: e, model: e.model}, true
}

// wait waits for ch (e's next change) or ctx, showing progress the load's
// progress meanwhile.
func (r *Registry) wait(ctx context.Context, e *entry, ch <-chan struct{}, progress parley.LoadProgress) error {
	var tick <-chan time.Time
	if progress != nil {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		tick = t.C
		r.showProgress(e, progress)
	}
	for {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("wait for model %q: %w", e.spec.Name, ctx.Err())
		case <-tick:
			r.showProgress(e, progress)
		}
	}
}

func (r *Registry) showProgress(e *entry, progress parley.LoadProgress) {
	r.mu.Lock()
	p, loading := e.progress, e.state == Loading
	r.mu.Unlock()
	if loading {
		progress(e.spec.Name, p)
	}
}

// startLoad starts loading e (Unloaded), first unloading the least recently
// used idle models that must make room for it; mu is held. It refuses a
// model over the whole budget, or one there is no room for because the
// models that hold it are in use or pinned.
func (r *Registry) startLoad(e *entry) error {
	if b := r.cfg.MemoryBudget; b > 0 && e.spec.Estimate > b {
		return parley.Errorf(parley.ETooLarge, "model %q %s", e.spec.Name, tooLarge(e.spec, b))
	}
	var resident []*entry // every model that holds memory
	for _, n := range r.names {
		if o := r.entries[n]; o != e && o.state != Unloaded {
			resident = append(resident, o)
		}
	}
	fits := func(res []*entry) bool {
		if r.cfg.MaxLoaded > 0 && len(res)+1 > r.cfg.MaxLoaded {
			return false
		}
		if r.cfg.MemoryBudget > 0 {
			used := e.spec.Estimate
			for _, o := range res {
				used += o.spec.Estimate
			}
			return used <= r.cfg.MemoryBudget
		}
		return true
	}
	// Candidates to unload: loaded, idle, not pinned, past their minimum
	// residency; least recently used first.
	var idle []*entry
	now := time.Now()
	for _, o := range resident {
		if o.state == Loaded && o.refs == 0 && !o.spec.Pin && !r.young(o, now) {
			idle = append(idle, o)
		}
	}
	slices.SortFunc(idle, func(a, b *entry) int { return a.lastUsed.Compare(b.lastUsed) })
	var victims []*entry
	for !fits(resident) {
		if len(idle) == 0 {
			err := parley.Errorf(parley.EBusy, "no room to load model %q: %s; try again when a reply ends", e.spec.Name, r.occupancy(resident, e))
			for _, o := range resident {
				if !o.spec.Pin {
					// Not all pinned: the room comes free when a reply
					// ends or a load or unload finishes.
					return &roomLater{err}
				}
			}
			return err
		}
		v := idle[0]
		idle = idle[1:]
		victims = append(victims, v)
		resident = slices.DeleteFunc(resident, func(o *entry) bool { return o == v })
	}
	for _, v := range victims {
		r.log.Info("unloading model to make room", zap.String("model", v.spec.Name), zap.String("for", e.spec.Name))
		r.setState(v, Unloading)
	}
	e.gen++
	e.loadErr, e.progress = nil, 0
	r.setState(e, Loading)
	r.wg.Add(1)
	go r.run(e, e.gen, victims)
	return nil
}

// young reports whether e, loaded, is still within its minimum residency
// (Config.MinResidency); mu is held.
func (r *Registry) young(e *entry, now time.Time) bool {
	return now.Before(e.loadedAt.Add(r.minResidency(e)))
}

// minResidency is e's minimum residency; mu is held.
func (r *Registry) minResidency(e *entry) time.Duration {
	if d := r.cfg.MinResidency; d >= 0 {
		return d
	}
	return min(DefaultResidencyFactor*e.loadTime, maxAutoResidency)
}

// errRoomLater marks startLoad's refusal when the room a model needs is
// held by models that will give it up (replies in flight end, loads and
// unloads finish): the request may wait for it. A room held by pinned
// models alone is refused at once.
var errRoomLater = errors.New("room later")

type roomLater struct{ err error }

func (r *roomLater) Error() string   { return r.err.Error() }
func (r *roomLater) Unwrap() []error { return []error{r.err, errRoomLater} }

// occupancy says what holds the room a model needs: the models loaded,
// which are in use or pinned, and the cap and budget.
func (r *Registry) occupancy(resident []*entry, e *entry) string {
	var parts []string
	var used int64
	for _, o := range resident {
		why := string(o.state)
		switch {
		case o.spec.Pin:
			why = "pinned"
		case o.refs > 0:
			why = fmt.Sprintf("%d replies in flight", o.refs)
		case o.state == Loaded && r.young(o, time.Now()):
			why = fmt.Sprintf("loaded %s ago, stays at least %s", time.Since(o.loadedAt).Round(time.Millisecond), r.minResidency(o).Round(time.Millisecond))
		}
		used += o.spec.Estimate
		parts = append(parts, fmt.Sprintf("%s (%s, %s)", o.spec.Name, MiB(o.spec.Estimate), why))
	}
	msg := "loaded: " + strings.Join(parts, ", ")
	if r.cfg.MaxLoaded > 0 {
		msg += fmt.Sprintf("; at most %d models loaded (--max-loaded-models)", r.cfg.MaxLoaded)
	}
	if r.cfg.MemoryBudget > 0 {
		msg += fmt.Sprintf("; %s of the %s budget used, %s needs %s", MiB(used), MiB(r.cfg.MemoryBudget), e.spec.Name, MiB(e.spec.Estimate))
	}
	return msg
}

// tooLarge says why sp never fits budget.
func tooLarge(sp Spec, budget int64) string {
	msg := fmt.Sprintf("needs about %s", MiB(sp.Estimate))
	if sp.EstimateDetail != "" {
		msg += " (" + sp.EstimateDetail + ")"
	}
	return msg + fmt.Sprintf(", more than the whole memory budget of %s (--max-models-memory); lower its ctx or parallel, or raise the budget", MiB(budget))
}

// MiB writes a byte count in MiB, one decimal.
func MiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// run unloads victims (marked Unloading), then loads e as load gen.
func (r *Registry) run(e *entry, gen int, victims []*entry) {
	defer r.wg.Done()
	for _, v := range victims {
		r.closeModel(v)
	}
	start := time.Now()
	m, err := r.load(r.ctx, e.spec.Name, func(f float64) {
		r.mu.Lock()
		e.progress = f
		r.mu.Unlock()
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil && r.closed {
		// Close came during the load: nothing will release it.
		r.mu.Unlock()
		_ = m.Close(context.Background())
		r.mu.Lock()
		err = errors.New("the server is shutting down")
	}
	if err != nil {
		var pe *parley.Error
		if !errors.As(err, &pe) {
			err = parley.Errorf(parley.EUnavailable, "model %q cannot be loaded: %v", e.spec.Name, err)
		}
		e.loadErr = err
		r.log.Warn("model load failed", zap.String("model", e.spec.Name), zap.Error(err))
		r.setState(e, Unloaded)
		return
	}
	e.model, e.loadTime, e.progress = m, time.Since(start), 1
	e.lastUsed = time.Now()
	e.loadedAt = e.lastUsed
	fields := []zap.Field{zap.String("model", e.spec.Name), zap.Duration("load_time", e.loadTime)}
	if lf, ok := m.(interface{ LogFields() []zap.Field }); ok {
		fields = append(fields, lf.LogFields()...)
	}
	r.log.Info("model loaded", fields...)
	r.setState(e, Loaded)
	r.scheduleIdle(e) // loaded for nobody (its waiters gave up, or an admin's load): its keep-alive runs
}

// closeModel closes v's model (v is Unloading) and marks it Unloaded.
func (r *Registry) closeModel(v *entry) {
	r.mu.Lock()
	m := v.model
	r.mu.Unlock()
	if m != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := m.Close(ctx); err != nil {
			r.log.Warn("model unload", zap.String("model", v.spec.Name), zap.Error(err))
		}
		cancel()
	}
	r.mu.Lock()
	v.model, v.drop, v.expires = nil, false, time.Time{}
	v.holdUntil, v.holdEver = time.Time{}, false
	r.setState(v, Unloaded)
	r.mu.Unlock()
	r.log.Info("model unloaded", zap.String("model", v.spec.Name))
}

// setState moves e to st and wakes whoever waits on e; mu is held.
func (r *Registry) setState(e *entry, st State) {
	e.state = st
	close(e.changed)
	e.changed = make(chan struct{})
	r.wakeRoom()
}

// wakeRoom wakes the requests that wait for room; mu is held.
func (r *Registry) wakeRoom() {
	close(r.freed)
	r.freed = make(chan struct{})
}

// release ends lease l.
func (r *Registry) release(l *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := l.e
	e.refs--
	e.lastUsed = time.Now()
	if l.hasKeep && e.state == Loaded {
		e.hold(l.keep, e.lastUsed)
	}
	r.scheduleIdle(e)
	r.wakeRoom()
}

// hold applies a request's keep-alive ka under KeepAliveExtend, from now:
// it may only hold the model longer than its own keep-alive would (0 and
// shorter ones change nothing; negative: until it must make room).
func (e *entry) hold(ka time.Duration, now time.Time) {
	switch {
	case ka < 0:
		e.holdEver = true
	case ka > 0:
		if t := now.Add(ka); t.After(e.holdUntil) {
			e.holdUntil = t
		}
	}
}

// scheduleIdle starts e's keep-alive when it is loaded and idle; mu is held.
func (r *Registry) scheduleIdle(e *entry) {
	if e.state != Loaded || e.refs > 0 || e.waiting > 0 {
		return
	}
	now := time.Now()
	switch {
	case e.drop:
		r.unloadLocked(e)
	case e.spec.Pin || e.keepAlive < 0 || e.holdEver:
		e.expires = time.Time{}
	case e.keepAlive == 0 && !e.holdUntil.After(now):
		r.unloadLocked(e)
	default:
		e.expires = now.Add(e.keepAlive)
		if e.holdUntil.After(e.expires) {
			e.expires = e.holdUntil
		}
	}
}

// unloadLocked starts unloading e (Loaded and idle); mu is held.
func (r *Registry) unloadLocked(e *entry) {
	r.setState(e, Unloading)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.closeModel(e)
	}()
}

// reap unloads idle models whose keep-alive has run out, until Close.
func (r *Registry) reap() {
	defer r.wg.Done()
	t := time.NewTicker(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case now := <-t.C:
			r.mu.Lock()
			if r.roomWaiters > 0 {
				r.wakeRoom() // a minimum residency may have ended
			}
			for _, n := range r.names {
				e := r.entries[n]
				if e.state == Loaded && e.refs == 0 && !e.expires.IsZero() && !now.Before(e.expires) {
					r.log.Info("model idle past its keep-alive", zap.String("model", n), zap.Duration("keep_alive", e.keepAlive))
					r.unloadLocked(e)
				}
			}
			r.mu.Unlock()
		}
	}
}

// Load loads the named model now (an admin's request, or loading at
// startup), and waits until it is loaded; its keep-alive then runs as
// after a reply (a pinned model stays).
func (r *Registry) Load(ctx context.Context, name string) error {
	l, err := r.Acquire(ctx, name, nil, nil)
	if err != nil {
		return err
	}
	l.Release()
	return nil
}

// Unload unloads the named model (an admin's request; pinned models too).
// A model with replies in flight unloads when the last ends; Unload then
// reports how many (an error with code busy) without waiting. A model that
// is not loaded is no error.
func (r *Registry) Unload(name string) error {
	name, err := r.Resolve(name)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[name]
	switch {
	case e.state != Loaded:
		return nil
	case e.refs > 0:
		e.drop = true
		return parley.Errorf(parley.EBusy, "model %q has %d replies in flight: it unloads when they end", name, e.refs)
	}
	r.unloadLocked(e)
	return nil
}

// Status reports every model, in configuration order.
func (r *Registry) Status() []Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Status, 0, len(r.names))
	for _, n := range r.names {
		e := r.entries[n]
		st := Status{
			Name: n, State: e.state, Default: n == r.cfg.Default, Pinned: e.spec.Pin,
			Estimate: e.spec.Estimate, EstimateDetail: e.spec.EstimateDetail,
			KeepAlive: e.keepAlive, ExpiresAt: e.expires, InFlight: e.refs, Waiting: e.waiting,
			Progress: e.progress, LoadTime: e.loadTime,
		}
		if e.spec.Pin || e.holdEver {
			st.KeepAlive = -1
		}
		if e.state == Loaded && st.ExpiresAt.IsZero() && (e.refs > 0 || e.waiting > 0) && !e.spec.Pin && !e.drop && !e.holdEver && e.keepAlive > 0 {
			// Its keep-alive starts when its last reply ends: a client that
			// reads this just after a reply (the lease's release can trail
			// the response) sees the expiry that reply set.
			st.ExpiresAt = time.Now().Add(e.keepAlive)
			if e.holdUntil.After(st.ExpiresAt) {
				st.ExpiresAt = e.holdUntil
			}
		}
		if e.loadErr != nil {
			st.LastError = parley.ErrorMessage(e.loadErr)
		}
		if e.state == Loaded {
			st.Model = e.model
		}
		out = append(out, st)
	}
	return out
}

// Used is the sum of the estimates of the models that hold memory (loaded,
// loading or unloading), and how many there are.
func (r *Registry) Used() (bytes int64, models int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.entries {
		if e.state != Unloaded {
			bytes += e.spec.Estimate
			models++
		}
	}
	return bytes, models
}

// Close unloads every model, waiting for loads in progress (their loaders
// see the registry's context cancelled) until ctx ends. Leases must have
// been released: the server drains its replies first.
func (r *Registry) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	r.wakeRoom()
	var loaded []*entry
	for _, n := range r.names {
		if e := r.entries[n]; e.state == Loaded {
			r.setState(e, Unloading)
			loaded = append(loaded, e)
		}
	}
	r.mu.Unlock()
	r.cancel()
	for _, e := range loaded {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.closeModel(e)
		}()
	}
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("models still loading or unloading: %w", ctx.Err())
	}
}
