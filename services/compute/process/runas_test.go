package process_test

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/process"
)

// nobody is the user the run-as tests run workloads as, skipping a test
// where it cannot: not root, or no user nobody.
func nobody(t *testing.T) process.User {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED, NOT PASSED: only root can run a workload as another user")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("SKIPPED, NOT PASSED: no user nobody: %v", err)
	}
	var want process.User
	if _, err := fmt.Sscan(u.Uid+" "+u.Gid, &want.UID, &want.GID); err != nil {
		t.Fatal(err)
	}
	return want
}

// TestRunAs: with RunAs, the workload runs as that user with no other
// group, owns its HOME, cannot read a 0600 file of the service's data
// directory (admin.token, as serve writes it) nor its supervisor's
// environment (the credential), while a file of the same directory that
// anyone may read it can; and it still freezes, resumes and stops, with
// each freezer.
func TestRunAs(t *testing.T) {
	want := nobody(t)
	for _, kind := range process.Freezers() {
		t.Run(kind, func(t *testing.T) {
			needFreezer(t, kind)
			t.Parallel()
			// A data directory others may pass through, as --data may be:
			// then only the files' own modes keep the workload out.
			data := t.TempDir()
			for _, dir := range []string{filepath.Dir(data), data} {
				if err := os.Chmod(dir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			admin, public := filepath.Join(data, "admin.token"), filepath.Join(data, "public")
			if err := os.WriteFile(admin, []byte("torpor-admin-secret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(public, []byte("anyone\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			g := newGateway(t)
			d, _ := newDriver(t, g, func(c *process.Config) { c.Data, c.Freezer, c.RunAs = data, kind, "nobody" })
			script := fmt.Sprintf(`/usr/bin/id -u; /usr/bin/id -G
if cat %s >/dev/null 2>&1; then echo admin.token:read; else echo admin.token:refused; fi
if cat %s >/dev/null 2>&1; then echo public:read; else echo public:refused; fi
if cat /proc/$PPID/environ >/dev/null 2>&1; then echo supervisor-environ:read; else echo supervisor-environ:refused; fi
if echo x > "$HOME/mine"; then echo home:written; else echo home:refused; fi
echo done
%s`, admin, public, counterScript)
			spec := newSpec("sh", "-c", script)
			startReady(t, d, g, spec, 1)
			var out []byte
			eventually(t, "the workload's report", func() bool {
				var err error
				if out, err = d.Logs(ctx(t), spec, 100); err != nil {
					t.Fatal(err)
				}
				return strings.HasSuffix(string(out), "done\n")
			})
			wantOut := fmt.Sprintf("%d\n%d\nadmin.token:refused\npublic:read\nsupervisor-environ:refused\nhome:written\ndone\n", want.UID, want.GID)
			if string(out) != wantOut {
				t.Fatalf("the workload says\n%s\nwant\n%s", out, wantOut)
			}
			for _, f := range []string{"work", "work/mine"} {
				fi, err := os.Stat(filepath.Join(process.Dir(d, spec.SandboxID), f))
				if err != nil {
					t.Fatal(err)
				}
				if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != want.UID || int(st.Gid) != want.GID {
					t.Errorf("%s is owned by %d:%d, want %d:%d", f, st.Uid, st.Gid, want.UID, want.GID)
				}
			}

			c := counterOf(d, spec)
			pid, _ := c.reach(t, 2)
			ref, err := d.Suspend(ctx(t), compute.Target{Spec: spec, Generation: 1})
			if err != nil {
				t.Fatal(err)
			}
			observe(t, d, spec, compute.StateFrozen, 1)
			if _, err := d.Resume(ctx(t), compute.Resume{Spec: spec, Generation: 2, Credential: cred(2), RestoreRef: ref}); err != nil {
				t.Fatal(err)
			}
			g.Await(t, spec.SandboxID, compute.ReportAttached, 2)
			_, frozenAt := c.read(t)
			if got, _ := c.reach(t, frozenAt+2); got != pid {
				t.Errorf("after the resume pid %d counts, want %d", got, pid)
			}
			if err := d.Stop(ctx(t), compute.Target{Spec: spec, Generation: 2}); err != nil {
				t.Fatal(err)
			}
			observe(t, d, spec, compute.StateStopped, 2)
		})
	}
}

// TestRunAsRefusesUnknownUsers: a user the host does not know, or a uid:gid
// that is no pair of numbers, is refused when the driver is made.
func TestRunAsRefusesUnknownUsers(t *testing.T) {
	for _, runAs := range []string{"no-such-user-torpor", "4000000000", "1:x", "x:1", ":", "1:-1", "4294967295:0"} {
		_, err := process.New(process.Config{Data: t.TempDir(), NATSURL: "nats://127.0.0.1:4222", RunAs: runAs})
		if err == nil || !strings.Contains(err.Error(), "run as") {
			t.Errorf("run as %q: %v, want a refusal that names the user", runAs, err)
		}
	}
}

// TestLookupUser: what --run-as takes.
func TestLookupUser(t *testing.T) {
	root := process.User{UID: 0, GID: 0}
	for _, c := range []struct {
		in   string
		want process.User
	}{
		{"root", root},
		{"0", root},
		{"0:0", root},
		{"1234:5678", process.User{UID: 1234, GID: 5678}},
	} {
		got, err := process.LookupUser(c.in)
		if err != nil || got != c.want {
			t.Errorf("LookupUser(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}
