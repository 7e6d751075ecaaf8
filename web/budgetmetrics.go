package web

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/parley-chat/parley/session"
)

// WithStoreUsage makes /metrics report the session store's byte budget:
// usage is called at every scrape (a Redis store asks Redis, bounded by a
// second), so it must be safe for concurrent use.
func WithStoreUsage(usage func() session.Usage) Option {
	return func(s *Server) { s.ops().storeUsage = usage }
}

// budgetCollectors reports the body budget and, when wired, the store's.
func (s *Server) budgetCollectors() []prometheus.Collector {
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_body_bytes_inflight",
			Help: "Bytes of the request bodies of the requests being handled, as the body budget counts them (a Content-Length counts whole from the start).",
		}, func() float64 { return float64(s.bodies.inUse()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_body_budget_bytes",
			Help: "The body budget (--max-body-bytes-inflight).",
		}, func() float64 { return float64(s.bodies.limit) }),
	}
	usage := s.ops().storeUsage
	if usage == nil {
		return cs
	}
	gauge := func(name, help string, v func(session.Usage) int64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(v(usage())) })
	}
	refused := prometheus.NewDesc("parley_store_writes_refused_total",
		"Session store writes refused for want of room, by reason: budget (--max-store-bytes), client_share (one client's share of it), disk (the disk, or Redis's memory, is full).",
		[]string{"reason"}, nil)
	return append(cs,
		gauge("parley_store_bytes", "Bytes of the session records stored (all replicas' with Redis).",
			func(u session.Usage) int64 { return u.Bytes }),
		gauge("parley_store_budget_bytes", "The session store's byte budget (--max-store-bytes; 0 = none).",
			func(u session.Usage) int64 { return u.Budget }),
		gauge("parley_store_client_share_bytes", "The most one client key may hold in the session store (0 = no share limit).",
			func(u session.Usage) int64 { return u.ClientShare }),
		&refusedCollector{usage: usage, desc: refused},
	)
}

// refusedCollector reports the store's refusal counters, one series per
// reason, from one Usage call per scrape.
type refusedCollector struct {
	usage func() session.Usage
	desc  *prometheus.Desc
}

func (c *refusedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *refusedCollector) Collect(ch chan<- prometheus.Metric) {
	u := c.usage()
	for reason, n := range map[string]int64{session.FullBudget: u.RefusedBudget, session.FullShare: u.RefusedShare, session.FullDisk: u.RefusedDisk} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), reason)
	}
}
