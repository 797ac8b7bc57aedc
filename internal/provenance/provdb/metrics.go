package provdb

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

var (
	writtenDesc     = prometheus.NewDesc("kipimo_provdb_records_written_total", "Records written to the store, by kind (duplicates included).", []string{"kind"}, nil)
	batchesDesc     = prometheus.NewDesc("kipimo_provdb_batches_total", "Messages (record batches) written and acknowledged.", nil, nil)
	rejectedDesc    = prometheus.NewDesc("kipimo_provdb_rejected_messages_total", "Messages refused and terminated, by reason: undecodable, document, columns, size.", []string{"reason"}, nil)
	writeErrorsDesc = prometheus.NewDesc("kipimo_provdb_write_errors_total", "Failed store writes (their batches are delivered again).", nil, nil)
)

// collector exports a Service's counts (Stats) as Prometheus metrics.
type collector struct{ s *Service }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{writtenDesc, batchesDesc, rejectedDesc, writeErrorsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	for k, n := range st.Written {
		ch <- prometheus.MustNewConstMetric(writtenDesc, prometheus.CounterValue, float64(n), string(k))
	}
	ch <- prometheus.MustNewConstMetric(batchesDesc, prometheus.CounterValue, float64(st.Batches))
	for r, n := range st.Rejected {
		ch <- prometheus.MustNewConstMetric(rejectedDesc, prometheus.CounterValue, float64(n), r)
	}
	ch <- prometheus.MustNewConstMetric(writeErrorsDesc, prometheus.CounterValue, float64(st.WriteErrors))
}

// register registers the service's metrics, and the Go runtime's and the
// process's under kipimo_, on reg.
func (s *Service) register(reg prometheus.Registerer) error {
	pre := prometheus.WrapRegistererWithPrefix("kipimo_", reg)
	if err := pre.Register(collectors.NewGoCollector()); err != nil {
		return err
	}
	if err := pre.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return err
	}
	return reg.Register(collector{s})
}
