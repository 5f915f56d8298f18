package cli

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/admin"
)

// AdminFlags are the flags of the run command's HTTP server (/metrics,
// /healthz, /readyz). It listens on loopback unless told otherwise, and takes
// an optional bearer token.
type AdminFlags struct {
	MetricsAddr       string `key:"operations.metrics_addr" field:"Admin.Addr" default:"127.0.0.1:9187" help:"Address of the /metrics, /healthz and /readyz HTTP endpoints (empty disables); loopback unless set, e.g. to 0.0.0.0:9187 with --metrics-token-file."`
	MetricsToken      string `key:"operations.metrics_token" help:"Bearer token every request to the HTTP endpoints must send (Authorization: Bearer TOKEN); prefer --metrics-token-file." placeholder:"TOKEN"`
	MetricsTokenFile  string `key:"operations.metrics_token_file" field:"Admin.Token" type:"path" help:"Read --metrics-token from this file instead (e.g. a mounted secret)." placeholder:"FILE"`
	MetricsOpenProbes bool   `key:"operations.metrics_open_probes" help:"With a token, serve /healthz and /readyz without it (for probes that cannot send a secret header); /metrics still needs it."`
	Pprof             bool   `key:"operations.pprof" help:"Also serve Go's CPU, heap and allocation profiles under /debug/pprof/ on --metrics-addr (behind the token like /metrics), e.g. go tool pprof http://127.0.0.1:9187/debug/pprof/profile?seconds=30."`
}

// validate reads --metrics-token-file and checks the token (RunCmd.Validate
// calls it last; it is no kong Validate hook, so config print, which embeds
// run's flags, reads no token file). Errors never show the token.
func (a *AdminFlags) validate() error {
	if err := checkListenAddr(a.MetricsAddr); err != nil {
		return flagError("metrics-addr", err.Error())
	}
	if a.MetricsTokenFile != "" {
		if a.MetricsToken != "" {
			return flagError("metrics-token-file", "and --metrics-token (CDC_RELAY_METRICS_TOKEN) are both set: use one")
		}
		b, err := os.ReadFile(a.MetricsTokenFile)
		if err != nil {
			return flagError("metrics-token-file", fmt.Sprintf("cannot be read: %v", err))
		}
		token := strings.TrimSpace(string(b))
		if token == "" {
			return flagError("metrics-token-file", fmt.Sprintf("names %s, which is empty", a.MetricsTokenFile))
		}
		if !admin.ValidToken(token) {
			return flagError("metrics-token-file", fmt.Sprintf("names %s, whose token has a space or a character other than printable ASCII", a.MetricsTokenFile))
		}
		a.MetricsToken, a.MetricsTokenFile = token, "" // read: a second Validate keeps the token
	}
	if a.MetricsToken != "" && !admin.ValidToken(a.MetricsToken) {
		return flagError("metrics-token", "has a space or a character other than printable ASCII")
	}
	return nil
}

// checkListenAddr checks addr as net.Listen("tcp", addr) will read it,
// without listening: host:port with a port from 0 to 65535 (or a service
// name); "" (no server) is fine. A port in use is found only at start.
func checkListenAddr(addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("is %q, not host:port (127.0.0.1:9187, :9187): %v", addr, strings.TrimPrefix(err.Error(), "address "+addr+": "))
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("is %q, whose port %q is not a port number from 0 to 65535", addr, port)
	}
	return nil
}

// startAdmin starts the HTTP server, or returns nil when --metrics-addr is
// empty.
func (a *AdminFlags) startAdmin(reg *prometheus.Registry, ready func() bool, notReady func() string, log zerolog.Logger) (*admin.Server, error) {
	if a.MetricsAddr == "" {
		return nil, nil
	}
	if err := a.validate(); err != nil { // done by the parser already; a no-op then
		return nil, err
	}
	srv, err := admin.Start(admin.Config{
		Addr: a.MetricsAddr, Registry: reg, Ready: ready, NotReady: notReady,
		Token: a.MetricsToken, OpenProbes: a.MetricsOpenProbes, Pprof: a.Pprof, Logger: log, Names: runNames.Within("Admin"),
	})
	if err != nil {
		return nil, flagError("metrics-addr", err.Error())
	}
	return srv, nil
}
