package registry_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm/registry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakes is a loader whose models record their loads and closes; a model
// named in fail fails to load, and a load waits on gate when it is set.
type fakes struct {
	mu     sync.Mutex
	loads  map[string]int
	closes map[string]int
	open   map[string]bool
	fail   map[string]error
	gate   chan struct{}
}

type fakeModel struct {
	f    *fakes
	name string
}

func (m *fakeModel) Close(context.Context) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if !m.f.open[m.name] {
		panic("closed twice: " + m.name)
	}
	m.f.open[m.name] = false
	m.f.closes[m.name]++
	return nil
}

func newFakes() *fakes {
	return &fakes{loads: map[string]int{}, closes: map[string]int{}, open: map[string]bool{}, fail: map[string]error{}}
}

func (f *fakes) load(ctx context.Context, name string, progress func(float64)) (registry.Model, error) {
	progress(0.5)
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[name]; err != nil {
		return nil, err
	}
	f.loads[name]++
	f.open[name] = true
	return &fakeModel{f: f, name: name}, nil
}

func (f *fakes) isOpen(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open[name]
}

func specs(names ...string) []registry.Spec {
	var out []registry.Spec
	for _, n := range names {
		out = append(out, registry.Spec{Name: n, Estimate: 100})
	}
	return out
}

func open(t *testing.T, sp []registry.Spec, cfg registry.Config) (*registry.Registry, *fakes) {
	t.Helper()
	f := newFakes()
	r, err := registry.New(sp, f.load, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(context.Background()); err != nil {
			t.Error(err)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		for n, o := range f.open {
			if o {
				t.Errorf("%s still open after Close", n)
			}
		}
	})
	return r, f
}

// eventually waits for cond (an unload runs in the background); its bound
// only catches a hang, so it is a minute.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting until %s", what)
}

// keep is a request's keep-alive of d.
func keep(d time.Duration) *time.Duration { return &d }

func acquire(t *testing.T, r *registry.Registry, name string) *registry.Lease {
	t.Helper()
	l, err := r.Acquire(context.Background(), name, nil, nil)
	if err != nil {
		t.Fatalf("acquire %s: %v", name, err)
	}
	return l
}

func TestResolveNamesAndUnknown(t *testing.T) {
	r, _ := open(t, specs("Small", "big"), registry.Config{})
	for in, want := range map[string]string{"": "Small", "small": "Small", "big:latest": "big", "BIG": "big"} {
		if got, err := r.Resolve(in); err != nil || got != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := r.Resolve("nope")
	if parley.ErrorCode(err) != parley.ENotFound || !strings.Contains(err.Error(), "Small, big") {
		t.Fatalf("unknown model: %v (want not_found naming the models served)", err)
	}
}

func TestLeastRecentlyUsedIdleUnloadsFirst(t *testing.T) {
	r, f := open(t, specs("a", "b", "c"), registry.Config{MaxLoaded: 2, KeepAlive: -1})
	acquire(t, r, "a").Release()
	time.Sleep(2 * time.Millisecond)
	acquire(t, r, "b").Release()
	time.Sleep(2 * time.Millisecond)
	acquire(t, r, "a").Release() // a is now more recent than b
	acquire(t, r, "c").Release()
	if f.isOpen("b") || !f.isOpen("a") || !f.isOpen("c") {
		t.Fatalf("open after loading c: a=%v b=%v c=%v; want b (least recently used) unloaded", f.isOpen("a"), f.isOpen("b"), f.isOpen("c"))
	}
}

func TestReplyInFlightIsNeverUnloaded(t *testing.T) {
	r, f := open(t, specs("a", "b"), registry.Config{MaxLoaded: 1, KeepAlive: -1})
	la := acquire(t, r, "a")
	// b waits for the room a's reply holds, in b's queue.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := r.Acquire(ctx, "b", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("b while a is in use: %v; want it to wait", err)
	}
	if !f.isOpen("a") {
		t.Fatal("a was unloaded under its reply")
	}
	got := make(chan error, 1)
	go func() {
		l, err := r.Acquire(context.Background(), "b", nil, nil)
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	eventually(t, "b waits", func() bool { return r.Status()[1].Waiting == 1 })
	if err := r.Unload("a"); parley.ErrorCode(err) != parley.EBusy {
		t.Fatalf("admin unload of a busy model: %v; want busy", err)
	}
	if !f.isOpen("a") {
		t.Fatal("the admin unload cut a's reply")
	}
	la.Release()
	if err := <-got; err != nil {
		t.Fatalf("b once a's reply ended: %v", err)
	}
	eventually(t, "a unloaded", func() bool { return !f.isOpen("a") })
}

func TestTryAcquireNeverLoads(t *testing.T) {
	r, f := open(t, specs("a"), registry.Config{KeepAlive: -1})
	if _, ok := r.TryAcquire("a"); ok || f.loads["a"] != 0 {
		t.Fatal("TryAcquire of a model not loaded")
	}
	acquire(t, r, "a").Release()
	l, ok := r.TryAcquire("a")
	if !ok || r.Status()[0].InFlight != 1 {
		t.Fatal("TryAcquire of a loaded model")
	}
	l.Release()
}

func TestPinnedModelStays(t *testing.T) {
	sp := specs("pinned", "b", "c")
	sp[0].Pin = true
	r, f := open(t, sp, registry.Config{MaxLoaded: 2, KeepAlive: time.Millisecond})
	acquire(t, r, "pinned").Release()
	for i := 0; i < 3; i++ {
		acquire(t, r, "b").Release()
		acquire(t, r, "c").Release()
	}
	// The reaper has run past the keep-alive when it has unloaded the
	// others (waiting for that, not for a time that a busy machine may
	// not have reached).
	eventually(t, "b and c unloaded by the reaper", func() bool { return !f.isOpen("b") && !f.isOpen("c") })
	if !f.isOpen("pinned") {
		t.Fatal("the pinned model was unloaded")
	}
	if f.loads["pinned"] != 1 {
		t.Fatalf("pinned loaded %d times", f.loads["pinned"])
	}
	// Only pinned models hold the room: no room, said so.
	sp2 := specs("p1", "p2", "x")
	sp2[0].Pin, sp2[1].Pin = true, true
	r2, _ := open(t, sp2, registry.Config{MaxLoaded: 2})
	acquire(t, r2, "p1").Release()
	acquire(t, r2, "p2").Release()
	if _, err := r2.Acquire(context.Background(), "x", nil, nil); parley.ErrorCode(err) != parley.EBusy || !strings.Contains(err.Error(), "pinned") {
		t.Fatalf("x with two pinned models at the cap: %v", err)
	}
}

func TestBudgetRefusesTooLargeAndMakesRoom(t *testing.T) {
	sp := []registry.Spec{{Name: "a", Estimate: 60 << 20}, {Name: "b", Estimate: 50 << 20}, {Name: "huge", Estimate: 200 << 20, EstimateDetail: "file 190 MiB + KV cache 10 MiB"}}
	r, f := open(t, sp, registry.Config{MemoryBudget: 100 << 20, KeepAlive: -1})
	_, err := r.Acquire(context.Background(), "huge", nil, nil)
	if parley.ErrorCode(err) != parley.ETooLarge || !strings.Contains(err.Error(), "200.0 MiB") || !strings.Contains(err.Error(), "100.0 MiB") || !strings.Contains(err.Error(), "file 190 MiB") {
		t.Fatalf("too large: %v; want too_large with the figures", err)
	}
	if f.loads["huge"] != 0 {
		t.Fatal("the too-large model was loaded")
	}
	acquire(t, r, "a").Release()
	acquire(t, r, "b").Release() // 110 MiB > 100: a goes
	if f.isOpen("a") || !f.isOpen("b") {
		t.Fatalf("a=%v b=%v; want a unloaded for b", f.isOpen("a"), f.isOpen("b"))
	}
	if used, n := r.Used(); used != 50<<20 || n != 1 {
		t.Fatalf("used %d bytes by %d models", used, n)
	}
}

func TestKeepAlive(t *testing.T) {
	r, f := open(t, specs("a", "b"), registry.Config{KeepAlive: time.Hour, ClientKeepAlive: registry.KeepAliveObey})
	// keep_alive 0 on the request (obeyed, as Ollama does): unloaded when
	// the reply ends.
	l, err := r.Acquire(context.Background(), "a", keep(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	eventually(t, "a unloads at once", func() bool { return !f.isOpen("a") })
	// A short keep-alive: unloaded by the reaper.
	l, err = r.Acquire(context.Background(), "b", keep(300*time.Millisecond), nil)
	if err != nil {
		t.Fatal(err)
	}
	// In use: it cannot expire before its keep-alive after now (the time
	// it was asked, between before and after).
	before := time.Now()
	exp := expiry(r, "b")
	after := time.Now()
	if exp.Before(before.Add(300*time.Millisecond)) || exp.After(after.Add(300*time.Millisecond)) {
		t.Fatalf("a model in use reports expiry %v after asking, want its keep-alive (300ms) from then", exp.Sub(before))
	}
	l.Release()
	if expiry(r, "b").IsZero() {
		t.Fatal("no expiry reported for an idle model with a keep-alive")
	}
	eventually(t, "b unloads after its keep-alive", func() bool { return !f.isOpen("b") })
}

func expiry(r *registry.Registry, name string) time.Time {
	for _, s := range r.Status() {
		if s.Name == name {
			return s.ExpiresAt
		}
	}
	return time.Time{}
}

// TestKeepAliveExtend: by default a request's keep-alive may lengthen the
// model's stay after its own reply, never shorten it or unload the model
// for the others who use it.
func TestKeepAliveExtend(t *testing.T) {
	r, f := open(t, specs("a", "b"), registry.Config{KeepAlive: time.Hour})
	for _, ka := range []time.Duration{0, time.Millisecond} {
		l, err := r.Acquire(context.Background(), "a", keep(ka), nil)
		if err != nil {
			t.Fatal(err)
		}
		l.Release()
		// The expiry is set under the same lock as the release: no wait.
		if left := time.Until(expiry(r, "a")); left < 59*time.Minute || !f.isOpen("a") {
			t.Fatalf("after keep_alive %v: a open %v, expires in %v; want the server's hour", ka, f.isOpen("a"), left)
		}
	}
	// Longer than the server's: honoured, for this request's reply.
	l, err := r.Acquire(context.Background(), "a", keep(3*time.Hour), nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	if left := time.Until(expiry(r, "a")); left < 179*time.Minute {
		t.Fatalf("keep_alive 3h: expires in %v", left)
	}
	// A later request without one does not shorten what was asked.
	acquire(t, r, "a").Release()
	if left := time.Until(expiry(r, "a")); left < 179*time.Minute {
		t.Fatalf("after a request without keep_alive: expires in %v, want the 3h asked before", left)
	}
	// Forever (negative): until it must make room, shown as such.
	l, err = r.Acquire(context.Background(), "b", keep(-1), nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	for _, s := range r.Status() {
		if s.Name == "b" && (s.KeepAlive >= 0 || !s.ExpiresAt.IsZero()) {
			t.Fatalf("keep_alive -1: %+v", s)
		}
	}
	// The admin's unload still unloads, and a reload starts afresh.
	if err := r.Unload("a"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a unloads on the admin's request", func() bool { return !f.isOpen("a") })
	acquire(t, r, "a").Release()
	if left := time.Until(expiry(r, "a")); left > time.Hour {
		t.Fatalf("reloaded a keeps the 3h of its previous load: expires in %v", left)
	}

	// KeepAliveIgnore: nothing a request says changes the expiry.
	r2, _ := open(t, specs("c"), registry.Config{KeepAlive: time.Hour, ClientKeepAlive: registry.KeepAliveIgnore})
	l, err = r2.Acquire(context.Background(), "c", keep(5*time.Hour), nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	if left := time.Until(expiry(r2, "c")); left > time.Hour {
		t.Fatalf("ignored keep_alive 5h: expires in %v", left)
	}
}

// TestMinResidency: a model loaded less than its minimum residency ago is
// not unloaded for another's room; the other waits in its queue, and is
// refused when its caller gives up. Without a residency it is unloaded.
func TestMinResidency(t *testing.T) {
	r, f := open(t, specs("a", "b"), registry.Config{MaxLoaded: 1, KeepAlive: -1, MinResidency: time.Hour})
	acquire(t, r, "a").Release()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		l, err := r.Acquire(ctx, "b", nil, nil)
		if err == nil {
			l.Release()
		}
		errc <- err
	}()
	eventually(t, "b waits for room", func() bool {
		for _, s := range r.Status() {
			if s.Name == "b" && s.Waiting == 1 {
				return true
			}
		}
		return false
	})
	if !f.isOpen("a") || f.isOpen("b") {
		t.Fatal("a young model was unloaded for another")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("b's wait ended with %v", err)
	}
	// The admin's unload is not held back.
	if err := r.Unload("a"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a unloads on the admin's request", func() bool { return !f.isOpen("a") })

	// The automatic residency (a multiple of the load time: microseconds
	// for these fakes) lets alternating requests through.
	r2, f2 := open(t, specs("c", "d"), registry.Config{MaxLoaded: 1, KeepAlive: -1, MinResidency: -1})
	for _, n := range []string{"c", "d", "c"} {
		acquire(t, r2, n).Release()
	}
	eventually(t, "d unloaded for c", func() bool { return f2.isOpen("c") && !f2.isOpen("d") })
}

func TestLoadFailureIsThatModelsAlone(t *testing.T) {
	r, f := open(t, specs("good", "bad"), registry.Config{})
	f.fail["bad"] = errors.New("model file bad.gguf: damaged GGUF header")
	_, err := r.Acquire(context.Background(), "bad", nil, nil)
	if parley.ErrorCode(err) != parley.EUnavailable || !strings.Contains(err.Error(), `"bad"`) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("bad model: %v", err)
	}
	acquire(t, r, "good").Release()
	for _, s := range r.Status() {
		if s.Name == "bad" && (s.State != registry.Unloaded || !strings.Contains(s.LastError, "damaged")) {
			t.Fatalf("bad's status: %+v", s)
		}
	}
}

func TestWaitersShareOneLoadAndQueueIsBounded(t *testing.T) {
	sp := specs("a")
	f := newFakes()
	f.gate = make(chan struct{})
	r, err := registry.New(sp, f.load, registry.Config{MaxWaiting: 3, KeepAlive: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	var seen atomic.Int32
	ctx := context.Background()
	progress := func(name string, frac float64) {
		if name == "a" && frac == 0.5 {
			seen.Add(1)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := r.Acquire(ctx, "a", nil, progress)
			if err == nil {
				l.Release()
			}
			errs <- err
		}()
	}
	eventually(t, "three waiters", func() bool { return r.Status()[0].Waiting == 3 })
	if _, err := r.Acquire(context.Background(), "a", nil, nil); parley.ErrorCode(err) != parley.EBusy {
		t.Fatalf("a fourth waiter: %v; want busy", err)
	}
	eventually(t, "progress shown", func() bool { return seen.Load() > 0 })
	close(f.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if f.loads["a"] != 1 {
		t.Fatalf("loaded %d times for three waiters", f.loads["a"])
	}
}

func TestConcurrentLeasesWithEviction(t *testing.T) {
	r, f := open(t, specs("a", "b", "c"), registry.Config{MaxLoaded: 2, KeepAlive: -1})
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			name := []string{"a", "b", "c"}[i%3]
			for {
				l, err := r.Acquire(context.Background(), name, nil, nil)
				if parley.ErrorCode(err) == parley.EBusy {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if !f.isOpen(name) {
					t.Errorf("leased %s while it is not open", name)
				}
				time.Sleep(time.Millisecond)
				if !f.isOpen(name) {
					t.Errorf("%s closed under a lease", name)
				}
				l.Release()
				return
			}
		}(i)
	}
	wg.Wait()
	if _, n := r.Used(); n > 2 {
		t.Fatalf("%d models resident over the cap of 2", n)
	}
}
