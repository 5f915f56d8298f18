package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestIsPermanent(t *testing.T) {
	plain := errors.New("something odd")
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "pg " + code} }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"unknown error is transient", plain, false},
		{"marked permanent", Permanent(plain), true},
		{"marked permanent, wrapped", fmt.Errorf("grant reward: %w", Permanent(plain)), true},
		{"marked transient", Transient(plain), false},
		{"outermost mark wins: transient over permanent", Transient(Permanent(plain)), false},
		{"outermost mark wins: permanent over transient", Permanent(fmt.Errorf("x: %w", Transient(plain))), true},
		{"mark wins over a permanent sqlstate", Transient(pg("23505")), false},
		{"mark wins over a transient sqlstate", Permanent(pg("40001")), true},
		{"a code does not classify", WithCode("invalid_payload", plain), false},
		{"a code with a permanent mark", WithCode("invalid_payload", Permanent(plain)), true},
		{"a permanent mark under a code", Permanent(WithCode("invalid_payload", plain)), true},
		{"context deadline", context.DeadlineExceeded, false},
		{"context deadline, wrapped", fmt.Errorf("call api: %w", context.DeadlineExceeded), false},
		{"net error", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false},
		{"os deadline", os.ErrDeadlineExceeded, false},
		{"connection dropped (EOF)", io.ErrUnexpectedEOF, false},
		{"serialization failure 40001", pg("40001"), false},
		{"deadlock 40P01", pg("40P01"), false},
		{"connection failure 08006", pg("08006"), false},
		{"too many connections 53300", pg("53300"), false},
		{"lock not available 55P03", pg("55P03"), false},
		{"statement timeout 57014", pg("57014"), false},
		{"admin shutdown 57P01", pg("57P01"), false},
		{"unique violation 23505", pg("23505"), true},
		{"foreign key violation 23503", pg("23503"), true},
		{"not null violation 23502", pg("23502"), true},
		{"check violation 23514", pg("23514"), true},
		{"invalid text representation 22P02", pg("22P02"), true},
		{"numeric out of range 22003", pg("22003"), true},
		{"invalid json 22032", pg("22032"), true},
		{"undefined table 42P01 (unknown: transient)", pg("42P01"), false},
		{"wrapped unique violation", fmt.Errorf("insert: %w", pg("23505")), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsPermanent(tc.err); got != tc.want {
				t.Errorf("IsPermanent(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestIsPermanentConnectError checks a real failed connection, which pgx
// reports as a *pgconn.ConnectError.
func TestIsPermanentConnectError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pgx.Connect(ctx, "postgres://nobody@"+addr+"/db?connect_timeout=5")
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		t.Fatalf("connect to a closed port: %v (%T), want a *pgconn.ConnectError", err, err)
	}
	if IsPermanent(err) {
		t.Errorf("IsPermanent(%v) = true, want transient", err)
	}
	if !isConnError(err) {
		t.Errorf("isConnError(%v) = false", err)
	}
}

func TestErrorCode(t *testing.T) {
	plain := errors.New("boom")
	tests := []struct {
		name      string
		err       error
		exhausted bool
		want      string
	}{
		{"permanent without code", Permanent(plain), false, CodePermanent},
		{"exhausted without code", Transient(plain), true, CodeRetriesExhausted},
		{"handler code", WithCode("invalid_payload", Permanent(plain)), false, "invalid_payload"},
		{"handler code, wrapped twice", fmt.Errorf("a: %w", Permanent(WithCode("no_such_player", plain))), false, "no_such_player"},
		{"handler code on an exhausted error", WithCode("points_service_down", plain), true, "points_service_down"},
		{"outermost code wins", WithCode("outer", WithCode("inner", plain)), false, "outer"},
		{"invalid code ignored", WithCode("Not A Code", Permanent(plain)), false, CodePermanent},
		{"invalid outer code, valid inner", WithCode("", WithCode("inner", plain)), false, "inner"},
		{"permanent sqlstate", &pgconn.PgError{Code: "23505"}, false, "sqlstate_23505"},
		{"permanent sqlstate with letters", &pgconn.PgError{Code: "22P02"}, false, "sqlstate_22p02"},
		{"exhausted sqlstate", &pgconn.PgError{Code: "40001"}, true, CodeRetriesExhausted},
		{"panic", WithCode(CodeHandlerPanic, plain), true, CodeHandlerPanic},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := errorCode(tc.err, tc.exhausted); got != tc.want {
				t.Errorf("errorCode(%v, %v) = %q, want %q", tc.err, tc.exhausted, got, tc.want)
			}
		})
	}
}

func TestMarksKeepTheError(t *testing.T) {
	base := &pgconn.PgError{Code: "23505", Message: "duplicate key"}
	for _, err := range []error{Permanent(base), Transient(base), WithCode("x", base)} {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr != base {
			t.Errorf("%T does not unwrap to the original error", err)
		}
		if err.Error() != base.Error() {
			t.Errorf("Error() = %q, want the original %q", err.Error(), base.Error())
		}
	}
	for _, err := range []error{Permanent(nil), Transient(nil), WithCode("x", nil)} {
		if err != nil {
			t.Errorf("marking nil = %v, want nil", err)
		}
	}
}
