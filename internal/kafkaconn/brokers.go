package kafkaconn

import (
	"errors"
	"net"
	"strconv"
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// ErrNoBrokers is the error ParseBrokers wraps when no broker is listed: a
// command that can run without Kafka may say how.
var ErrNoBrokers = errors.New("a broker list is required")

// ParseBrokers reads the brokers setting: comma-separated host:port entries
// (a host may be an IPv6 address in brackets), spaces trimmed, empty ones
// left out. It returns them in order, or a *setting.FieldError of field
// Brokers, named by names, the Namer of the configuration holding them (the
// sink's): none listed, a port missing or not from 1 to 65535, no host.
func ParseBrokers(list []string, names setting.Namer) ([]string, error) {
	var brokers []string
	for _, b := range list {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		return nil, names.Errorf("Brokers", "%w: comma-separated Kafka brokers, e.g. kafka-1:9092,kafka-2:9092; set the brokers", ErrNoBrokers)
	}
	for _, b := range brokers {
		if !strings.Contains(b, ":") {
			return nil, names.Errorf("Brokers", "a Kafka broker is listed as %q without a port: use host:port, e.g. kafka-1:9092, in the brokers", b)
		}
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" {
			return nil, names.Errorf("Brokers", "Kafka broker %q is not host:port: use e.g. kafka-1:9092 or [::1]:9092 in the brokers", b)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, names.Errorf("Brokers", "Kafka broker %q has port %q: the port must be a number from 1 to 65535; fix the brokers", b, port)
		}
	}
	return brokers, nil
}
