package kafkaconn

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/setting"
)

func TestParseBrokers(t *testing.T) {
	names := setting.Namer{}.Within("Sink") // as the relay holds the brokers
	tests := []struct {
		name string
		in   []string
		want []string
		err  string // substring of the error, "" for none
	}{
		{name: "two", in: []string{"kafka-1:9092", "kafka-2:9093"}, want: []string{"kafka-1:9092", "kafka-2:9093"}},
		{name: "trimmed, empty left out", in: []string{" kafka-1:9092 ", "", " "}, want: []string{"kafka-1:9092"}},
		{name: "IPv6", in: []string{"[::1]:9092"}, want: []string{"[::1]:9092"}},
		{name: "none", in: nil, err: "a broker list is required: comma-separated Kafka brokers"},
		{name: "blank", in: []string{" ", ""}, err: "is required"},
		{name: "without a port", in: []string{"kafka"}, err: `"kafka" without a port`},
		{name: "second without a port", in: []string{"a:9092", "b"}, err: `"b" without a port`},
		{name: "IPv6 without a port", in: []string{"[::1]"}, err: `"[::1]" is not host:port`},
		{name: "no host", in: []string{":9092"}, err: `":9092" is not host:port`},
		{name: "empty port", in: []string{"kafka:"}, err: "the port must be a number from 1 to 65535"},
		{name: "port not a number", in: []string{"kafka:abc"}, err: `has port "abc"`},
		{name: "port 0", in: []string{"kafka:0"}, err: "from 1 to 65535"},
		{name: "port too big", in: []string{"kafka:65536"}, err: "from 1 to 65535"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBrokers(tt.in, names)
			if tt.err == "" {
				if err != nil || !slices.Equal(got, tt.want) {
					t.Fatalf("ParseBrokers(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
				}
				return
			}
			var fe *setting.FieldError
			if !errors.As(err, &fe) || fe.Field != "Sink.Brokers" {
				t.Fatalf("ParseBrokers(%q) error = %v, want a *setting.FieldError of Sink.Brokers", tt.in, err)
			}
			if text := err.Error(); !strings.Contains(text, tt.err) || !strings.HasSuffix(text, names.Name("Brokers")) {
				t.Errorf("ParseBrokers(%q) error %q, want it to say %q and end with %q", tt.in, text, tt.err, names.Name("Brokers"))
			}
			if got := errors.Is(err, ErrNoBrokers); got != (len(tt.want) == 0 && strings.Contains(tt.err, "required")) {
				t.Errorf("errors.Is(%v, ErrNoBrokers) = %v", err, got)
			}
		})
	}
}
