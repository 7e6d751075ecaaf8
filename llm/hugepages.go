package llm

// Model weights on transparent huge pages.
//
// Decoding one token on a CPU reads every weight once: hundreds of
// megabytes spread over tens of thousands of 4 KiB pages, more than the
// TLB holds, so the reads also walk page tables. llama.cpp maps the model
// file (page-cache pages, 4 KiB on most file systems), and a model it
// repacks for the CPU (Q4_0 on AVX2) lives in memory it allocates, also in
// 4 KiB pages where the kernel's transparent huge pages are "madvise" (the
// common default). Read into memory it allocates and advised onto 2 MiB
// pages, the same weights decode 4-14% faster here (docs/notes/2026-11-27-huge-pages.md).
//
// llama.cpp does not say where its weight buffers are, so the load is
// bracketed: the anonymous memory that appears while the model loads, in
// mappings large enough to be weights, is advised (MADV_HUGEPAGE) and
// collapsed onto huge pages in the background (MADV_COLLAPSE, Linux 6.1).
// glibc's malloc thresholds are fixed first (malloc.go), so that blocks
// that large always come as new mappings. The Go heap's mapping is left
// out. The context's creation (its KV cache
// and compute buffers) is bracketed the same way, advised but not
// collapsed. Brackets take turns (hugeMu), so one load's mappings are not
// another's.

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"go.uber.org/zap"
)

// HugePages values (Config.HugePages, --huge-pages).
const (
	HugePagesAuto = "auto"
	HugePagesOff  = "off"
)

const (
	madvHugepage = 14 // MADV_HUGEPAGE
	madvCollapse = 25 // MADV_COLLAPSE
	hugePageSize = 2 << 20
	// minWeightMapping is the smallest new mapping taken for weights: above
	// a thread's stack (8 MiB), below any model worth the trouble.
	minWeightMapping = 16 << 20
)

// thpSettingPath is the kernel's transparent huge page setting (a variable
// for tests).
var thpSettingPath = "/sys/kernel/mm/transparent_hugepage/enabled"

// thpSetting returns the kernel's transparent huge page mode: "always",
// "madvise" or "never" ("" when unknown).
func thpSetting() string {
	b, err := os.ReadFile(thpSettingPath)
	if err != nil {
		return ""
	}
	// "always [madvise] never": the bracketed word is the setting.
	s := string(b)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return ""
	}
	return s[i+1 : j]
}

// memAvailable is /proc/meminfo's MemAvailable in bytes (0 when unknown).
func memAvailable() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			return kiB(rest)
		}
	}
	return 0
}

// kiB parses a /proc field's value ("  1234 kB") into bytes (0 when it is
// not one).
func kiB(v string) uint64 {
	kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
	if err != nil {
		return 0
	}
	return kb << 10
}

// planHugePages decides whether a model loads into memory on huge pages,
// and when not, why (for the log; "" when the mode is off).
func planHugePages(mode string, onCPU bool, fileSize int64) (bool, string) {
	switch {
	case mode == HugePagesOff:
		return false, ""
	case !onCPU:
		return false, "the weights are on a GPU"
	}
	switch s := thpSetting(); s {
	case "always", "madvise":
	case "":
		return false, "this kernel has no transparent huge pages"
	default:
		return false, "transparent huge pages are " + s + " on this machine (/sys/kernel/mm/transparent_hugepage/enabled)"
	}
	if avail := memAvailable(); avail > 0 && uint64(fileSize) > avail/2 {
		return false, fmt.Sprintf("the file (%d MiB) is more than half the available memory (%d MiB): it stays mapped, so the kernel can page it", fileSize>>20, avail>>20)
	}
	return true, ""
}

// hugeMu makes loads onto huge pages take turns (see the file comment).
var hugeMu sync.Mutex

// mapping is an address range of /proc/self/maps.
type mapping struct{ start, end uintptr }

// anonMappings parses /proc/self/maps for the private, writable anonymous
// mappings (no file, not the brk heap or a stack).
func anonMappings(maps []byte) []mapping {
	var out []mapping
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		// start-end perms offset dev inode [path]
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[1] != "rw-p" || f[4] != "0" || len(f) > 5 && !strings.HasPrefix(f[5], "[anon:") {
			continue
		}
		if m, ok := parseRange(f[0]); ok {
			out = append(out, m)
		}
	}
	return out
}

// parseRange parses the address range that begins a line of
// /proc/self/maps or of a mapping's header in /proc/self/smaps
// ("7f0000000000-7f0002000000").
func parseRange(field string) (mapping, bool) {
	lo, hi, ok := strings.Cut(field, "-")
	if !ok {
		return mapping{}, false
	}
	a, err1 := strconv.ParseUint(lo, 16, 64)
	b, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || b <= a {
		return mapping{}, false
	}
	return mapping{uintptr(a), uintptr(b)}, true
}

// newWeightMappings returns the address ranges of after's mappings that
// were in no mapping of before (the kernel merges a new mapping into an
// adjacent one with the same flags, so a whole mapping of after may be
// partly old), that hold at least minWeightMapping bytes, and whose mapping
// does not contain keep (an address of the Go heap).
func newWeightMappings(before, after []mapping, keep uintptr) []mapping {
	old := slices.Clone(before)
	slices.SortFunc(old, func(a, b mapping) int { return cmp.Compare(a.start, b.start) })
	var out []mapping
	for _, m := range after {
		if keep >= m.start && keep < m.end {
			continue
		}
		// What of m no old mapping covers, in address order.
		lo := m.start
		for _, o := range old {
			if o.end <= lo || o.start >= m.end {
				continue
			}
			if o.start > lo && o.start-lo >= minWeightMapping {
				out = append(out, mapping{lo, o.start})
			}
			lo = max(lo, o.end)
		}
		if m.end > lo && m.end-lo >= minWeightMapping {
			out = append(out, mapping{lo, m.end})
		}
	}
	return out
}

// bytesIn is the size of ms.
func bytesIn(ms []mapping) (n uint64) {
	for _, m := range ms {
		n += uint64(m.end - m.start)
	}
	return n
}

// hugeRange is the part of m that whole huge pages cover.
func hugeRange(m mapping) (uintptr, uintptr) {
	lo := (m.start + hugePageSize - 1) &^ (hugePageSize - 1)
	hi := m.end &^ (hugePageSize - 1)
	return lo, max(lo, hi)
}

func madvise(lo, hi uintptr, advice int) error {
	if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, lo, hi-lo, uintptr(advice)); e != 0 {
		return e
	}
	return nil
}

// loadOnHugePages runs load (which reads the weights into memory) and
// advises the mappings that appeared meanwhile onto huge pages. It returns
// load's error, the ranges advised and, when there are none, why.
func loadOnHugePages(load func() error) (loadErr error, advised []mapping, err error) {
	mallocForWeights()
	hugeMu.Lock()
	defer hugeMu.Unlock()
	before, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return load(), nil, err
	}
	if err := load(); err != nil {
		return err, nil, nil
	}
	after, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return nil, nil, err
	}
	probe := new([64]byte) // an address on the Go heap, whose mapping stays as it is
	var errs []error
	for _, m := range newWeightMappings(anonMappings(before), anonMappings(after), uintptr(unsafe.Pointer(probe))) {
		lo, hi := hugeRange(m)
		if hi == lo {
			continue
		}
		if err := madvise(lo, hi, madvHugepage); err != nil {
			errs = append(errs, fmt.Errorf("madvise(MADV_HUGEPAGE): %w", err))
			continue
		}
		advised = append(advised, mapping{lo, hi})
	}
	if len(advised) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("no new mapping large enough for the weights"))
	}
	return nil, advised, errors.Join(errs...)
}

// collapser moves advised memory onto huge pages in the background: pages
// in memory already wait for khugepaged's scan otherwise, which takes
// minutes (MADV_COLLAPSE does it now, Linux 6.1). The model is usable
// meanwhile: a collapse copies each 2 MiB and swaps the page tables under
// the readers. A range nothing has touched yet cannot be collapsed (the
// kernel refuses it); advised, it comes as huge pages when touched.
type collapser struct {
	stop atomic.Bool
	done chan struct{}
	huge uint64 // bytes on huge pages when it finished (read after done)
}

// startCollapse collapses ms, the model's weights.
func startCollapse(ms []mapping, log *zap.Logger) *collapser {
	c := &collapser{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		t0 := time.Now()
		var err error
		for _, m := range ms {
			for lo := m.start; lo < m.end && !c.stop.Load(); lo += hugePageSize {
				if e := madvise(lo, lo+hugePageSize, madvCollapse); e != nil && err == nil {
					err = fmt.Errorf("madvise(MADV_COLLAPSE, Linux 6.1): %w", e)
				}
			}
		}
		if c.stop.Load() {
			return
		}
		if smaps, e := os.ReadFile("/proc/self/smaps"); e == nil {
			c.huge = anonHugeBytes(smaps, ms)
		}
		log.Info("model weights on huge pages", zap.Uint64("huge_pages_mib", c.huge>>20),
			zap.Duration("took", time.Since(t0)), zap.NamedError("collapse_error", err))
	}()
	return c
}

// close stops the collapse and waits for it (before the weights are freed).
func (c *collapser) close() {
	if c != nil {
		c.stop.Store(true)
		<-c.done
	}
}

// loadWeights loads a model through load: into memory on huge pages
// (load(true) reads the weights into memory) when cfg.HugePages and the
// machine allow it, else mapped from the file (load(false)). It records the
// bytes advised onto huge pages and the collapse under way in dp (the
// backend closes dp.huge before it frees the model), and logs why there
// are none.
func loadWeights(cfg Config, meta metadata, dp *placement, log *zap.Logger, load func(inMemory bool) error) error {
	on, why := planHugePages(cfg.HugePages, dp.info.GPULayers == 0, meta.info.SizeBytes)
	if !on {
		if why != "" {
			log.Info("model weights mapped from the file, not on huge pages", zap.String("why", why))
		}
		return load(false)
	}
	loadErr, ms, err := loadOnHugePages(func() error { return load(true) })
	if loadErr != nil {
		return loadErr
	}
	if len(ms) == 0 {
		if meta.info.SizeBytes < 2*hugePageSize {
			// Weights this small hold no aligned 2 MiB page: nothing is lost,
			// nothing to warn about on a normal start.
			log.Info("model weights read into memory; too small for huge pages", zap.Int64("bytes", meta.info.SizeBytes))
			return nil
		}
		log.Warn("model weights read into memory, but not onto huge pages", zap.Error(err))
		return nil
	}
	dp.info.HugePagesBytes = bytesIn(ms)
	dp.huge = startCollapse(ms, log)
	return nil
}

// createOnHugePages runs create (which creates the llama.cpp context: its
// KV cache and compute buffers) and, when the weights went onto huge pages
// (dp.huge set), advises the buffers' new mappings too: attention reads the KV
// cache at every step, and a conversation's grows with each turn (with the
// weights, 6-11% faster decoding at a depth of 900 tokens here,
// docs/notes/2026-11-27-huge-pages.md). They are
// not collapsed: most of a KV cache is untouched at first, and a collapse
// would fill every 2 MiB around a touched page at once. Advised, a page
// comes as a 2 MiB one when first touched, so the resident memory grows
// 2 MiB at a time, up to the buffers' size.
func createOnHugePages(dp *placement, log *zap.Logger, create func() error) error {
	if dp.huge == nil {
		return create()
	}
	createErr, ms, err := loadOnHugePages(create)
	if createErr != nil || len(ms) == 0 {
		if createErr == nil {
			log.Info("the context's buffers are not on huge pages", zap.Error(err))
		}
		return createErr
	}
	log.Info("the context's buffers (KV cache, compute) advised onto huge pages", zap.Uint64("mib", bytesIn(ms)>>20))
	return nil
}

// anonHugeBytes sums smaps' AnonHugePages over the mappings that lie in ms
// (madvise splits a mapping at the huge-page boundaries, so a range of ms
// may now be several mappings).
func anonHugeBytes(smaps []byte, ms []mapping) uint64 {
	var total uint64
	in := false
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) >= 5 && !strings.HasSuffix(f[0], ":") {
			if r, ok := parseRange(f[0]); ok {
				in = slices.ContainsFunc(ms, func(m mapping) bool { return r.start >= m.start && r.end <= m.end })
				continue
			}
		}
		if rest, ok := strings.CutPrefix(line, "AnonHugePages:"); ok && in {
			total += kiB(rest)
		}
	}
	return total
}
