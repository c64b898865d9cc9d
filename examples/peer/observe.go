package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/lockmesh/lockmesh/internal/hostguard"
	"github.com/lockmesh/lockmesh/internal/release"
	"github.com/lockmesh/lockmesh/node"
)

// The -http listener: lockmesh's metrics for Prometheus and the status
// page. Prometheus lives here, in the example, and not in package node,
// which only speaks OpenTelemetry: an application picks its own exporter.

// statusPrefix is where the status page (Node.Handler) is mounted.
const statusPrefix = "/debug/lockmesh"

// httpShutdownTimeout bounds how long the peer waits on exit for
// requests in flight; a status request may wait up to 5 s on the cluster.
const httpShutdownTimeout = 5 * time.Second

// newMeterProvider makes an OpenTelemetry MeterProvider whose metrics the
// returned registry collects. The registry is the peer's own, not
// prometheus.DefaultRegisterer: the exporter's families then come out
// alone, with no process or Go runtime collectors mixed in, and a second
// peer in one process (a test) would not collide on registration.
func newMeterProvider() (*sdkmetric.MeterProvider, *prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	// Named, so that target_info says what runs instead of the SDK's
	// "unknown_service:" and the binary's file name.
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", "lockmesh-peer"),
		attribute.String("service.version", release.Version)))
	if err != nil {
		return nil, nil, fmt.Errorf("metrics resource: %w", err)
	}
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res)), reg, nil
}

// metricsHandler serves reg's metrics followed by dragonboat's Raft
// metrics (node.WriteRaftMetrics) as one Prometheus text exposition.
// The two never share a family name: dragonboat's all start with
// "dragonboat_", lockmesh's with "lockmesh_", and the exporter's only
// other is target_info.
func metricsHandler(reg *prometheus.Registry) http.Handler {
	exporter := promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// Raft's lines are appended to the body as plain text, which a
		// gzipped body could not take.
		DisableCompression: true,
		ErrorHandling:      promhttp.HTTPErrorOnError,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Without an Accept header promhttp answers in the text format,
		// the only one Raft's lines can be appended to; a scraper that
		// asked for protobuf or OpenMetrics takes text too.
		r = r.Clone(r.Context())
		r.Header.Del("Accept")
		sw := &statusWriter{ResponseWriter: w}
		exporter.ServeHTTP(sw, r)
		if sw.status == 0 || sw.status == http.StatusOK {
			node.WriteRaftMetrics(w)
		}
	})
}

// statusWriter remembers the status code written, so that Raft's lines
// are not appended to an error message.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (sw *statusWriter) WriteHeader(code int) {
	if sw.status == 0 {
		sw.status = code
	}
	sw.ResponseWriter.WriteHeader(code)
}

// httpHosts are the names, besides loopback addresses and localhost, that
// the -http listener answers to: -http's own host, unless it is empty or
// unspecified (every interface: no name a browser sends), and -http-host's
// names.
func httpHosts(cfg config) []string {
	var hosts []string
	if h, _, err := net.SplitHostPort(cfg.httpAddr); err == nil && h != "" {
		if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
			hosts = append(hosts, h)
		}
	}
	return append(hosts, cfg.httpHostNames...)
}

// newHTTPHandler serves newHTTPMux's routes only to requests whose Host
// is loopback, localhost or one of hosts: every route shows what a web
// page the operator visits must not read by pointing a name of its own
// at the listener (DNS rebinding). The status page checks the same
// names itself.
func newHTTPHandler(n *node.Node, reg *prometheus.Registry, hosts []string) http.Handler {
	mux := newHTTPMux(n.Handler(node.WithAllowedHosts(hosts...)), reg)
	return hostguard.Handler(mux, hosts, "given to -http-host")
}

// newHTTPMux routes /metrics, the status page under statusPrefix, and
// "/" to the status page.
func newHTTPMux(status http.Handler, reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metricsHandler(reg))
	mux.Handle(statusPrefix+"/", http.StripPrefix(statusPrefix, status))
	mux.Handle("GET /{$}", http.RedirectHandler(statusPrefix+"/", http.StatusFound))
	// Go's profiles, as etcd and Consul serve them, for "where do this
	// peer's CPU and memory go" (go tool pprof http://ADDR/debug/pprof/heap).
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}

// httpServer is the -http listener's server.
type httpServer struct {
	srv  *http.Server
	done chan error // Serve's error, once it returned

	stopOnce sync.Once
	stopErr  error
}

// serveHTTP serves mux on l until stop is called.
func serveHTTP(l net.Listener, mux http.Handler) *httpServer {
	s := &httpServer{
		srv: &http.Server{
			Handler: mux,
			// A slow or stalled client must not hold a connection (and
			// with it a goroutine) for ever.
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
		},
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(l) }()
	return s
}

// stop stops accepting connections, waits up to httpShutdownTimeout for
// requests in flight, then closes the rest. Later calls return the first
// call's error; on a nil server it does nothing.
func (s *httpServer) stop() error {
	if s == nil {
		return nil
	}
	s.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), httpShutdownTimeout)
		defer cancel()
		err := s.srv.Shutdown(ctx)
		if err != nil {
			err = errors.Join(fmt.Errorf("http shutdown: %w", err), s.srv.Close())
		}
		if serveErr := <-s.done; !errors.Is(serveErr, http.ErrServerClosed) {
			err = errors.Join(err, fmt.Errorf("http serve: %w", serveErr))
		}
		s.stopErr = err
	})
	return s.stopErr
}
