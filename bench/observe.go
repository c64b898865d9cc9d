package bench

import (
	"context"
	"sync"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/lockmesh/lockmesh/node"
)

// observeMode is how much of lockmesh's telemetry a bench cluster
// records.
type observeMode uint8

const (
	observeNone    observeMode = iota
	observeMetrics             // every metric, collected as a scrape would
	observeTraces              // every metric, and every call traced
)

// scrapeInterval is how often the metrics are collected, as Prometheus
// would scrape them.
const scrapeInterval = 10 * time.Second

// observers are the OpenTelemetry SDK providers of a bench cluster: one
// meter provider whose reader is collected every scrapeInterval (the
// data is dropped, as after an export), and with observeTraces a tracer
// provider that samples every span and batches them to an exporter that
// drops them.
type observers struct {
	mode   observeMode
	meters *sdkmetric.MeterProvider
	tracer *sdktrace.TracerProvider
	done   chan struct{}
	wg     sync.WaitGroup
}

func newObservers(mode observeMode) *observers {
	o := &observers{mode: mode, done: make(chan struct{})}
	if mode == observeNone {
		return o
	}
	reader := sdkmetric.NewManualReader()
	o.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		t := time.NewTicker(scrapeInterval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				var rm metricdata.ResourceMetrics
				_ = reader.Collect(context.Background(), &rm)
			case <-o.done:
				return
			}
		}
	}()
	if mode == observeTraces {
		o.tracer = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
			sdktrace.WithBatcher(dropSpans{}))
	}
	return o
}

// tune gives a peer's config the providers.
func (o *observers) tune(c *node.Config) {
	if o.meters != nil {
		c.MeterProvider = o.meters
	}
	if o.tracer != nil {
		c.TracerProvider = o.tracer
	}
}

// stop ends the collection and shuts the providers down.
func (o *observers) stop() {
	if o == nil || o.mode == observeNone {
		return
	}
	close(o.done)
	o.wg.Wait()
	_ = o.meters.Shutdown(context.Background())
	if o.tracer != nil {
		_ = o.tracer.Shutdown(context.Background())
	}
}

// dropSpans is a span exporter that drops what it is given.
type dropSpans struct{}

func (dropSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (dropSpans) Shutdown(context.Context) error                             { return nil }
