package gateway

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
)

// pushViews is blockingViews whose watch sends what the test puts on ch.
type pushViews struct {
	blockingViews
	ch chan events.View
}

func (p pushViews) Watch(ctx context.Context, _ uint64) (<-chan events.View, error) {
	out := make(chan events.View)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case v := <-p.ch:
				out <- v
			}
		}
	}()
	return out, nil
}

const shortTimeout = 200 * time.Millisecond

// timeoutServer serves the HTTP API with every timeout shortTimeout.
func timeoutServer(t *testing.T, views Views) string {
	t.Helper()
	r := newRig(t)
	svc, err := NewService(r.store, r.names, fakeDrivers{}, r.creds, Config{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = Timeouts{ReadHeader: shortTimeout, Read: shortTimeout, Write: shortTimeout, Idle: shortTimeout}.Server(NewHTTP(svc, views, nil, zerolog.Nop()))
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestSlowClientsAreCutOff: a client that sends half a header, half a body,
// or nothing more after an answer, is disconnected by the server within
// its timeout.
func TestSlowClientsAreCutOff(t *testing.T) {
	addr := timeoutServer(t, blockingViews{})
	cases := []struct{ name, sent string }{
		{"half a header", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "},
		{"half a body", "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"name\":"},
		{"idle after an answer", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"nothing at all", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, tc.sent); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			// Whatever the server answers, it must then close: reading
			// ends in EOF (or a reset) well before our own deadline.
			_ = conn.SetReadDeadline(time.Now().Add(10 * shortTimeout))
			_, err = io.Copy(io.Discard, conn)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the connection was still open after %s", time.Since(start))
			}
		})
	}
}

// TestWatchOutlivesTimeouts: a watch goes on streaming past the read and
// write timeouts, which bound the other requests.
func TestWatchOutlivesTimeouts(t *testing.T) {
	views := pushViews{ch: make(chan events.View)}
	addr := timeoutServer(t, views)
	resp, err := http.Get("http://" + addr + "/v1/watch")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-time.After(3 * shortTimeout) // past both deadlines
	views.ch <- events.View{ID: "0193b0a4-0000-7000-8000-0000000000aa", Seq: 7}
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if strings.HasPrefix(lines.Text(), "id: 7") {
			return
		}
	}
	t.Fatalf("the watch ended before its view came: %v", lines.Err())
}
