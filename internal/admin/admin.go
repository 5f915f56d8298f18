// Package admin serves the relay's HTTP surface: /metrics (Prometheus), /healthz
// (the process is alive) and /readyz (streaming and producing). Nothing here
// changes state.
package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Server is the running HTTP server.
type Server struct {
	srv  *http.Server
	addr net.Addr
	done chan struct{}
}

// Handler returns the admin routes.
func Handler(reg *prometheus.Registry, ready func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready: not streaming, or Kafka is not accepting events", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// Start listens on addr and serves in a goroutine that Shutdown stops.
func Start(addr string, reg *prometheus.Registry, ready func() bool, log zerolog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	s := &Server{
		srv:  &http.Server{Handler: Handler(reg, ready), ReadHeaderTimeout: 5 * time.Second},
		addr: ln.Addr(),
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Str("addr", addr).Msg("metrics server stopped")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("serving /metrics, /healthz, /readyz")
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.addr }

// Shutdown stops the server and waits for its goroutine.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}
