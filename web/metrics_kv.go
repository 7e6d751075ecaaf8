package web

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// KVCacheStats is the engine's swap of sessions' KV state (EngineStats.KVCache):
// states saved when a slot goes to another session, restored on the
// session's next turn, and the states that could not be used.
type KVCacheStats struct {
	Saves, SavedBytes       int64            // states saved, and their bytes
	Restores                int64            // states restored into a slot
	RestoredTokens          int64            // prompt tokens they spared
	RestoreTime             time.Duration    // spent restoring, disk reads included
	SharedWaits             int64            // replies whose end waited for their state to reach the shared tier
	SharedWaitTime          time.Duration    // the time those waits took, in all
	SaveTime                time.Duration    // spent by the decode loop copying states out
	DiskWrites              int64            // files written
	DiskWriteBytes          int64            // their bytes
	Fallbacks               map[string]int64 // saved states not used (the conversation evaluated again), by reason
	FilesRefused            map[string]int64 // files removed: "corrupt" (truncated, bad checksum) or "foreign" (another model or build)
	RAMBytes, DiskBytes     int64            // held now
	RAMEntries, DiskEntries int              // held now
	Unsaved                 int64            // slots whose state changed since it was last saved
	DiskPending             int              // saved states queued for disk, not written yet
	DiskFull                int64            // saved states not written: no room above the disk's free-space floor
	Pruned                  int64            // files removed at start for their age
}

// kvCollectors reads the KV swap's counters at scrape time.
func kvCollectors(stats func() EngineStats) []prometheus.Collector {
	kv := func() KVCacheStats { return stats().KVCache }
	counter := func(name, help string, v func(KVCacheStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return v(kv()) })
	}
	gauge := func(name, help string, v func(KVCacheStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return v(kv()) })
	}
	cs := []prometheus.Collector{
		counter("parley_kv_saves_total", "KV states of sessions saved when their slot went to another session (or at idle, for the disk).",
			func(s KVCacheStats) float64 { return float64(s.Saves) }),
		counter("parley_kv_saved_bytes_total", "Bytes of the KV states saved.",
			func(s KVCacheStats) float64 { return float64(s.SavedBytes) }),
		counter("parley_kv_restores_total", "KV states restored into a slot on a session's next turn.",
			func(s KVCacheStats) float64 { return float64(s.Restores) }),
		counter("parley_kv_restored_tokens_total", "Prompt tokens served from restored KV states instead of being decoded.",
			func(s KVCacheStats) float64 { return float64(s.RestoredTokens) }),
		counter("parley_kv_restore_seconds_total", "Time spent restoring KV states, disk reads included.",
			func(s KVCacheStats) float64 { return s.RestoreTime.Seconds() }),
		counter("parley_kv_shared_waits_total", "Replies whose end waited for their KV state to reach the shared tier (--kv-cache-shared-wait).",
			func(s KVCacheStats) float64 { return float64(s.SharedWaits) }),
		counter("parley_kv_shared_wait_seconds_total", "Time replies' ends waited for their KV state to reach the shared tier, in all.",
			func(s KVCacheStats) float64 { return s.SharedWaitTime.Seconds() }),
		counter("parley_kv_save_seconds_total", "Time the decode loop spent copying KV states out of llama.cpp.",
			func(s KVCacheStats) float64 { return s.SaveTime.Seconds() }),
		counter("parley_kv_disk_writes_total", "KV state files written.",
			func(s KVCacheStats) float64 { return float64(s.DiskWrites) }),
		counter("parley_kv_disk_written_bytes_total", "Bytes of KV state files written.",
			func(s KVCacheStats) float64 { return float64(s.DiskWriteBytes) }),
		gauge("parley_kv_ram_bytes", "Bytes of KV states held in memory (--kv-cache-ram bounds it).",
			func(s KVCacheStats) float64 { return float64(s.RAMBytes) }),
		gauge("parley_kv_disk_bytes", "Bytes of KV state files kept (--kv-cache-disk bounds it).",
			func(s KVCacheStats) float64 { return float64(s.DiskBytes) }),
		gauge("parley_kv_ram_entries", "Sessions whose KV state is held in memory.",
			func(s KVCacheStats) float64 { return float64(s.RAMEntries) }),
		gauge("parley_kv_disk_entries", "Sessions whose KV state is kept on disk.",
			func(s KVCacheStats) float64 { return float64(s.DiskEntries) }),
		gauge("parley_kv_unsaved_slots", "Cache slots whose KV state changed since it was last saved (the idle pass saves them once no request has come for 50 ms).",
			func(s KVCacheStats) float64 { return float64(s.Unsaved) }),
		gauge("parley_kv_disk_pending", "Saved KV states queued for disk, not written yet.",
			func(s KVCacheStats) float64 { return float64(s.DiskPending) }),
		counter("parley_kv_disk_full_total", "Saved KV states not written to disk: no room above --kv-cache-min-free even without the older states (they stay in RAM).",
			func(s KVCacheStats) float64 { return float64(s.DiskFull) }),
		counter("parley_kv_files_pruned_total", "KV state files removed at start because nobody used them within --session-ttl.",
			func(s KVCacheStats) float64 { return float64(s.Pruned) }),
	}
	for _, reason := range []string{"mismatch", "corrupt", "foreign", "read", "rejected"} {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "parley_kv_fallbacks_total", Help: "Saved KV states not used on a session's turn (the conversation was evaluated again), by reason.",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(kv().Fallbacks[reason]) }))
	}
	for _, reason := range []string{"corrupt", "foreign"} {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "parley_kv_files_refused_total", Help: "KV state files refused and removed: corrupt (truncated or a bad checksum) or foreign (another model, llama.cpp build or KV layout).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(kv().FilesRefused[reason]) }))
	}
	return cs
}
