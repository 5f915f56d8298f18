package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// newToxiServer returns the in-process toxiproxy server proxies belong to. It
// does not listen: proxies and toxics are driven through the Go API.
func newToxiServer() *toxiproxy.ApiServer {
	return toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
}

// netProxy is one toxiproxy TCP proxy, run in-process, whose connections can
// be slowed, throttled, black-holed, reset or cut.
type netProxy struct {
	p *toxiproxy.Proxy
}

// startProxy starts a proxy listening on listen ("127.0.0.1:0" for any port)
// in front of upstream.
func startProxy(srv *toxiproxy.ApiServer, name, listen, upstream string) (*netProxy, error) {
	p := toxiproxy.NewProxy(srv, name, listen, upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("start proxy %s on %s: %w", name, listen, err)
	}
	return &netProxy{p: p}, nil
}

// addr returns the proxy's listen address, host:port.
func (n *netProxy) addr() string {
	n.p.Lock()
	defer n.p.Unlock()
	return n.p.Listen
}

// toxic is a toxiproxy toxic: Type is one of latency, bandwidth, timeout,
// reset_peer, …; Stream "upstream" (client to server) or "downstream".
type toxic struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Stream     string         `json:"stream"`
	Toxicity   float32        `json:"toxicity"`
	Attributes map[string]any `json:"attributes"`
}

// add installs t on every connection, open and future.
func (n *netProxy) add(t toxic) error {
	if t.Toxicity == 0 {
		t.Toxicity = 1
	}
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("add toxic %s: %w", t.Name, err)
	}
	if _, err := n.p.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
		return fmt.Errorf("add toxic %s to proxy %s: %w", t.Name, n.p.Name, err)
	}
	return nil
}

// remove uninstalls the toxic called name.
func (n *netProxy) remove(ctx context.Context, name string) error {
	if err := n.p.Toxics.RemoveToxic(ctx, name); err != nil {
		return fmt.Errorf("remove toxic %s from proxy %s: %w", name, n.p.Name, err)
	}
	return nil
}

// clear removes every toxic.
func (n *netProxy) clear(ctx context.Context) { n.p.Toxics.ResetToxics(ctx) }

// cut closes every connection and the listener: new connections are refused
// until restore.
func (n *netProxy) cut() { n.p.Stop() }

// restore listens again on the same address after cut.
func (n *netProxy) restore() error {
	if err := n.p.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		return fmt.Errorf("restore proxy %s: %w", n.p.Name, err)
	}
	return nil
}

// close removes the toxics and stops the proxy.
func (n *netProxy) close() {
	n.clear(context.Background())
	n.p.Stop()
}

// advertisedListener is a listener that reports another address than the one
// it listens on. kfake advertises each broker's listener address in metadata,
// so a broker listening behind a proxy reports the proxy's address and every
// client connection (the relay's produce connections included, not only the
// bootstrap) goes through the proxy.
type advertisedListener struct {
	net.Listener
	advertised net.Addr
}

func (l advertisedListener) Addr() net.Addr { return l.advertised }
