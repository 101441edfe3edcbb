package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// Wake is the wake-on-traffic section: one process sandbox (same node)
// with wake_on_traffic serving HTTP (busybox httpd), suspended and then
// woken by a request through its forward, Rounds times. Latency is the
// client's: its connection to the forward opened → the first byte of the
// answer read (the service's torpor_wake_seconds stops earlier, at the
// request's first byte forwarded to the sandbox).
type Wake struct {
	Rounds  int         `json:"rounds"`
	Latency Percentiles `json:"connect_to_first_byte_ms"`
	// Missing says why the section could not run here (no busybox).
	Missing string `json:"missing,omitempty"`
	// Accel is the vm row's accelerator (RunVMWake), kvm or tcg.
	Accel string `json:"accel,omitempty"`
}

// RunWake measures the wake section on a fresh service (fsync interval).
func RunWake(ctx context.Context, cfg Config, start Starter, progress io.Writer) (*Wake, error) {
	cfg, err := cfg.resolved()
	if err != nil {
		return nil, err
	}
	w := &Wake{Rounds: 50}
	if cfg.Quick {
		w.Rounds = 10
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		w.Rounds, w.Missing = 0, "no busybox on PATH (the woken sandbox serves HTTP with busybox httpd)"
		return w, nil
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "torpor-bench-wake-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	svc, err := start(ctx, dir, "interval")
	if err != nil {
		return nil, err
	}
	defer func() { _ = svc.Stop() }()
	c := httpClient(svc, 1)
	var ids []string
	defer func() { deleteAll(ctx, c, ids) }()
	r := torpor.CreateRequest{Driver: "process", WakeOnTraffic: true, Command: []string{"sh", "-c",
		fmt.Sprintf(`echo woken > index.html; exec %s httpd -f -p 127.0.0.1:%d -h .`, busybox, port)}}
	if _, err := createEach(ctx, c, r, 1, 30*time.Second, &ids); err != nil {
		return nil, fmt.Errorf("wake: %w", err)
	}
	id := ids[0]
	// httpd listens a moment after it runs.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("wake: httpd of %s not listening: %w", id, err)
		}
	}
	addr, err := openForward(ctx, svc, id, port)
	if err != nil {
		return nil, fmt.Errorf("wake: %w", err)
	}
	fmt.Fprintf(progress, "bench: wake: a process sandbox suspended and woken through its forward %d times\n", w.Rounds)
	if w.Latency, err = wakeRounds(ctx, c, id, addr, w.Rounds); err != nil {
		return nil, fmt.Errorf("wake: %w", err)
	}
	return w, nil
}

// wakeRounds suspends sandbox id and wakes it with a GET through its
// forward at addr, rounds times, and returns the wakes' latencies
// (wakeOnce's).
func wakeRounds(ctx context.Context, c *torpor.Client, id, addr string, rounds int) (Percentiles, error) {
	step := waitStep(c)
	var lats []time.Duration
	for range rounds {
		if err := step(ctx, "suspend", id, events.PhaseSuspended); err != nil {
			return Percentiles{}, fmt.Errorf("%w (the sandbox's last event: %s)", err, lastEvent(ctx, c, id))
		}
		took, err := wakeOnce(addr)
		if err != nil {
			return Percentiles{}, fmt.Errorf("%w (the sandbox's last event: %s)", err, lastEvent(ctx, c, id))
		}
		lats = append(lats, took)
	}
	return percentilesOf(lats), nil
}

// wakeOnce sends a GET through the forward at addr and returns the time
// from the connection opened to the answer's first byte; the answer must be
// the sandbox's page.
func wakeOnce(addr string) (time.Duration, error) {
	t0 := time.Now()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		return 0, err
	}
	br := bufio.NewReader(conn)
	if _, err := br.Peek(1); err != nil {
		return 0, fmt.Errorf("no answer through the forward: %w", err)
	}
	took := time.Since(t0)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "woken") {
		return 0, fmt.Errorf("through the forward: %q, want the sandbox's page", rest)
	}
	return took, nil
}

// openForward opens a forward to port of sandbox id and returns its address.
func openForward(ctx context.Context, svc Service, id string, port int) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+svc.HTTPAddr()+"/v1/sandboxes/"+id+"/forwards",
		strings.NewReader(fmt.Sprintf(`{"listen":"127.0.0.1:0","port":%d}`, port)))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+svc.AdminToken())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var fw events.Forward
	if resp.StatusCode != http.StatusCreated {
		body, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("open a forward: %d %s", resp.StatusCode, body)
	}
	if err := json.NewDecoder(resp.Body).Decode(&fw); err != nil {
		return "", err
	}
	return fw.Address, nil
}

// freePort is a TCP port of the loopback nothing listens on just now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
