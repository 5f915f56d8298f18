// Package admin serves the relay's HTTP surface: /metrics (Prometheus), /healthz
// (the process is alive) and /readyz (streaming and producing), and, when asked
// for, Go's profiles under /debug/pprof/. Nothing here changes state: every
// route is a GET (HEAD), and there is no other route.
//
// With a token set, every request must carry "Authorization: Bearer <token>"
// (except /healthz and /readyz when Config.OpenProbes is set); the token is
// compared in constant time and never logged.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Config is what Start serves and how.
type Config struct {
	// Addr is the host:port to listen on.
	Addr string
	// Registry is served at /metrics.
	Registry *prometheus.Registry
	// Ready answers /readyz: 200 while it returns true, 503 otherwise.
	Ready func() bool
	// NotReady, when set, says in the 503's body what is down (Postgres,
	// Kafka) or that the relay is not streaming yet.
	NotReady func() string
	// Token, when not empty, is the bearer token every request must carry;
	// a request without it gets 401 and a WWW-Authenticate: Bearer header.
	Token string
	// OpenProbes serves /healthz and /readyz without the token, for probes
	// that cannot send a secret header. /metrics still needs it.
	OpenProbes bool
	// Pprof also serves net/http/pprof's profiles under /debug/pprof/ (behind
	// the token like /metrics): CPU, heap and allocation profiles of the
	// running relay, for diagnosing where its time and memory go.
	Pprof bool
	// Logger receives the start line, a serve failure, and a warning when
	// the server is reachable from other hosts without a token.
	Logger zerolog.Logger
	// Names names the settings (Addr, Token) in that warning.
	Names setting.Namer
}

// ValidToken reports whether token can be sent as is in an Authorization
// header: visible ASCII, no spaces.
func ValidToken(token string) bool {
	for i := 0; i < len(token); i++ {
		if token[i] <= ' ' || token[i] > '~' {
			return false
		}
	}
	return true
}

// Server is the running HTTP server.
type Server struct {
	srv  *http.Server
	addr net.Addr
	done chan struct{}
	// stop cancels every request's context, so that a request that waits
	// (a CPU profile of N seconds) ends when the server shuts down.
	stop context.CancelFunc
}

// Handler returns the admin routes, behind the token check when cfg.Token is
// set.
func Handler(cfg Config) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !cfg.Ready() {
			why := "not streaming, or Kafka is not accepting events"
			if cfg.NotReady != nil {
				if w := cfg.NotReady(); w != "" {
					why = w
				}
			}
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if cfg.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index) // heap, allocs, goroutine… by name
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	if cfg.Token == "" {
		return mux
	}
	return requireToken(cfg.Token, cfg.OpenProbes, mux)
}

// requireToken lets a request through to next only with the bearer token (or,
// with openProbes, to exactly /healthz or /readyz). The check runs before
// routing, so a client without the token learns nothing about the routes.
func requireToken(token string, openProbes bool, next http.Handler) http.Handler {
	// Comparing digests keeps the comparison constant-time in the token's
	// length too (subtle.ConstantTimeCompare returns early on a length mismatch).
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openProbes && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz") {
			next.ServeHTTP(w, r)
			return
		}
		got, ok := bearer(r.Header.Get("Authorization"))
		if ok {
			sum := sha256.Sum256([]byte(got))
			ok = subtle.ConstantTimeCompare(sum[:], want[:]) == 1
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="cdc-relay"`)
			http.Error(w, "unauthorized: send Authorization: Bearer <token>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearer returns the credentials of an "Authorization: Bearer <token>" header
// value; the scheme is case-insensitive (RFC 9110, 11.1).
func bearer(header string) (string, bool) {
	scheme, cred, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	cred = strings.TrimLeft(cred, " ")
	return cred, cred != ""
}

// Start listens on cfg.Addr and serves in a goroutine that Shutdown stops.
func Start(cfg Config) (*Server, error) {
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	base, stop := context.WithCancel(context.Background())
	s := &Server{
		srv: &http.Server{Handler: Handler(cfg), ReadHeaderTimeout: 5 * time.Second,
			BaseContext: func(net.Listener) context.Context { return base }},
		addr: ln.Addr(),
		done: make(chan struct{}),
		stop: stop,
	}
	log := cfg.Logger
	if cfg.Token == "" && !Loopback(ln.Addr()) {
		log.Warn().Str("addr", ln.Addr().String()).
			Msgf("the metrics server is reachable from other hosts without a token: anyone who can connect reads /metrics, /healthz and /readyz; set %s, or %s to a loopback address if only this host scrapes",
				cfg.Names.Name("Token"), cfg.Names.Name("Addr"))
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Str("addr", cfg.Addr).Msg("metrics server stopped")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Bool("token", cfg.Token != "").
		Bool("open_probes", cfg.Token != "" && cfg.OpenProbes).Bool("pprof", cfg.Pprof).Msg("serving /metrics, /healthz, /readyz")
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.addr }

// Shutdown stops the server and waits for its goroutine. Requests in
// progress see their context canceled: a CPU profile being taken ends early
// rather than holding the stop up.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}

// Loopback reports whether addr is a loopback address (127.0.0.0/8, ::1),
// reachable only from this host; an unspecified address (":9187", "0.0.0.0")
// is not.
func Loopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
