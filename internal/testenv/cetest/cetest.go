// Package cetest reads Kafka records back as CloudEvents with the CloudEvents
// Go SDK (github.com/cloudevents/sdk-go/v2, Apache-2.0), so that tests check
// the relay's CloudEvents against an implementation of the Kafka protocol
// binding other than the relay's own. Only tests import it: the relay binary
// does not link the SDK (go list -deps ./cmd/cdc-relay names no cloudevents
// package), and the SDK's root module brings no Kafka client.
package cetest

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// Kafka binding names: binary-mode attributes are headers with this prefix,
// and content-type is the datacontenttype (binary) or the event format
// (structured).
const (
	attrPrefix        = "ce_"
	headerContentType = "content-type"
)

var binarySpecs = spec.WithPrefix(attrPrefix)

// ToEvent decodes rec as the CloudEvents Kafka protocol binding says a
// receiver does: structured mode when its content-type header is a
// CloudEvents event format the SDK knows (the JSON format), binary mode when
// it carries ce_specversion; anything else is an error. It returns the event,
// validated (event.Validate), and the mode it was read in.
func ToEvent(rec sandbox.Record) (*event.Event, binding.Encoding, error) {
	m, err := newMessage(rec)
	if err != nil {
		return nil, binding.EncodingUnknown, err
	}
	ev, err := binding.ToEvent(context.Background(), m)
	if err != nil {
		return nil, m.ReadEncoding(), fmt.Errorf("record %s/%d@%d as a CloudEvent (%s): %w", rec.Topic, rec.Partition, rec.Offset, m.ReadEncoding(), err)
	}
	if err := ev.Validate(); err != nil {
		return ev, m.ReadEncoding(), fmt.Errorf("record %s/%d@%d is not a valid CloudEvent (%s): %w", rec.Topic, rec.Partition, rec.Offset, m.ReadEncoding(), err)
	}
	return ev, m.ReadEncoding(), nil
}

// message is a sandbox.Record as a binding.Message.
type message struct {
	rec     sandbox.Record
	format  format.Format // structured mode
	version spec.Version  // binary mode
}

var (
	_ binding.Message               = (*message)(nil)
	_ binding.MessageMetadataReader = (*message)(nil)
)

func newMessage(rec sandbox.Record) (*message, error) {
	m := &message{rec: rec}
	ct := rec.Headers[headerContentType]
	if strings.HasPrefix(strings.ToLower(ct), format.Prefix) {
		if m.format = format.Lookup(ct); m.format == nil {
			return nil, fmt.Errorf("record %s/%d@%d: content-type %q is a CloudEvents format the SDK does not know", rec.Topic, rec.Partition, rec.Offset, ct)
		}
		return m, nil
	}
	if sv, ok := rec.Headers[binarySpecs.PrefixedSpecVersionName()]; ok {
		if m.version = binarySpecs.Version(sv); m.version == nil {
			return nil, fmt.Errorf("record %s/%d@%d: ce_specversion %q is no CloudEvents version", rec.Topic, rec.Partition, rec.Offset, sv)
		}
		return m, nil
	}
	return nil, fmt.Errorf("record %s/%d@%d is no CloudEvent: neither a CloudEvents content-type nor ce_specversion (headers %v)", rec.Topic, rec.Partition, rec.Offset, rec.Headers)
}

func (m *message) ReadEncoding() binding.Encoding {
	if m.format != nil {
		return binding.EncodingStructured
	}
	return binding.EncodingBinary
}

func (m *message) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.rec.Value))
}

func (m *message) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range m.rec.Headers {
		switch {
		case k == headerContentType:
			if err := w.SetAttribute(m.version.AttributeFromKind(spec.DataContentType), v); err != nil {
				return err
			}
		case strings.HasPrefix(k, attrPrefix):
			if a := m.version.Attribute(k); a != nil {
				if err := w.SetAttribute(a, v); err != nil {
					return err
				}
			} else if err := w.SetExtension(strings.TrimPrefix(k, attrPrefix), v); err != nil {
				return err
			}
		}
	}
	if len(m.rec.Value) > 0 {
		return w.SetData(bytes.NewReader(m.rec.Value))
	}
	return nil
}

func (m *message) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	if m.version == nil {
		return nil, nil
	}
	a := m.version.AttributeFromKind(k)
	if a == nil {
		return nil, nil
	}
	name := a.PrefixedName()
	if k == spec.DataContentType {
		name = headerContentType
	}
	if v, ok := m.rec.Headers[name]; ok {
		return a, v
	}
	return a, nil
}

func (m *message) GetExtension(name string) interface{} {
	if v, ok := m.rec.Headers[attrPrefix+name]; ok {
		return v
	}
	return nil
}

func (m *message) Finish(error) error { return nil }
