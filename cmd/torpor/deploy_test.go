package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/torpor/torpor/internal/busauth"
)

// The manifests under deploy/ and what each of them must agree with. Every
// torpor command line in them is parsed by the cobra command of its verb
// (serve, driver, creds), taken from rootCmd as the binary runs it: a flag
// that does not exist, or a value its flag does not take, fails. Every NATS
// configuration is read by nats-server's own parser. Every port a manifest
// names (NATS clients, routes, monitoring, torpor's HTTP and its /metrics)
// is the port the other side listens on, and every credentials file a
// command reads is one the manifests write or hold, with the roles it
// needs. The YAML is read with go.yaml.in/yaml/v3, which the module
// already requires (taskfile_test.go); it resolves compose's anchors and
// merge keys as compose does.

// TestDeployNATSConfig: the shipped nats-server config parses, with the
// auth.conf `torpor creds --server-config` writes beside it, and asks for
// what torpor relies on (JetStream, fsync of every write, torpor's
// operator).
func TestDeployNATSConfig(t *testing.T) {
	opts := deployNATSOptions(t, t.TempDir())
	if !opts.JetStream {
		t.Error("JetStream is off")
	}
	if !opts.SyncAlways {
		t.Error("sync_interval is not always: the durable default is every write fsynced")
	}
	if opts.Host != "127.0.0.1" || opts.Port != 4222 {
		t.Errorf("listen %s:%d, want 127.0.0.1:4222", opts.Host, opts.Port)
	}
}

// torporLine is a torpor command line found in a manifest.
type torporLine struct {
	where string   // the manifest and its service or container
	args  []string // what follows "torpor": the verb, then its flags
}

func (l torporLine) String() string { return l.where + ": torpor " + strings.Join(l.args, " ") }

// deployVerbs are the verbs the manifests run.
var deployVerbs = []string{"serve", "driver", "creds"}

// parseTorpor parses l as the binary would, with a fresh command tree from
// rootCmd, and returns its command with the flags set (nil, with the test
// failed, when it does not parse). A flag hidden from --help fails too.
func parseTorpor(t *testing.T, l torporLine) *cobra.Command {
	t.Helper()
	root := rootCmd()
	c, rest, err := root.Find(l.args)
	if err != nil || c == root || !slices.Contains(deployVerbs, c.Name()) {
		t.Errorf("%s: not a verb of %v (%v)", l, deployVerbs, err)
		return nil
	}
	if err := c.ParseFlags(rest); err != nil {
		t.Errorf("%s: %v (torpor %s --help lists its flags)", l, err, c.Name())
		return nil
	}
	if err := c.ValidateArgs(c.Flags().Args()); err != nil {
		t.Errorf("%s: %v", l, err)
		return nil
	}
	help := c.Flags().FlagUsages()
	for _, a := range rest {
		name, _, _ := strings.Cut(a, "=")
		if !strings.HasPrefix(name, "-") {
			continue
		}
		f := c.Flags().Lookup(strings.TrimLeft(name, "-"))
		if !strings.HasPrefix(name, "--") {
			f = c.Flags().ShorthandLookup(strings.TrimPrefix(name, "-"))
		}
		if f == nil || !strings.Contains(help, "--"+f.Name+" ") {
			t.Errorf("%s: %s is not in torpor %s --help", l, name, c.Name())
		}
	}
	return c
}

// flagString is the value of c's flag name (a string flag).
func flagString(t *testing.T, c *cobra.Command, name string) string {
	t.Helper()
	v, err := c.Flags().GetString(name)
	if err != nil {
		t.Fatalf("torpor %s --%s: %v", c.Name(), name, err)
	}
	return v
}

// flagSlice is the value of c's flag name (a comma-list flag).
func flagSlice(t *testing.T, c *cobra.Command, name string) []string {
	t.Helper()
	v, err := c.Flags().GetStringSlice(name)
	if err != nil {
		t.Fatalf("torpor %s --%s: %v", c.Name(), name, err)
	}
	return v
}

// natsURLs are the host and port of each URL of a --nats-url.
func natsURLs(t *testing.T, where, list string) []hostPort {
	t.Helper()
	var out []hostPort
	for _, s := range strings.Split(list, ",") {
		u, err := url.Parse(s)
		if err != nil || u.Scheme != "nats" {
			t.Errorf("%s: --nats-url %q: want nats://host:port each (%v)", where, s, err)
			continue
		}
		out = append(out, splitHostPort(t, where, u.Host))
	}
	return out
}

type hostPort struct {
	host string
	port int
}

func splitHostPort(t *testing.T, where, addr string) hostPort {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		t.Errorf("%s: %q: want host:port", where, addr)
	}
	return hostPort{h, n}
}

// includeRE finds a nats-server configuration's include (of auth.conf).
var includeRE = regexp.MustCompile(`(?m)^include\s+(\S+)\s*$`)

// natsOptions reads the nats-server configuration file as nats-server does,
// with the auth.conf that `torpor creds --server-config` writes for a new
// bus at the path its include names.
func natsOptions(t *testing.T, file string) *server.Options {
	t.Helper()
	conf, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := includeRE.FindSubmatch(conf)
	if m == nil {
		t.Fatalf("%s: includes no auth.conf: a server without torpor's operator takes anyone", file)
	}
	dir := t.TempDir()
	writeAuthConf(t, t.TempDir(), filepath.Join(dir, string(m[1])))
	path := filepath.Join(dir, filepath.Base(file))
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(opts.TrustedOperators) != 1 || opts.SystemAccount == "" {
		t.Errorf("%s: operators %d, system account %q; want torpor's", file, len(opts.TrustedOperators), opts.SystemAccount)
	}
	if !opts.JetStream || !opts.SyncAlways {
		t.Errorf("%s: JetStream %v, sync_interval always %v; want both", file, opts.JetStream, opts.SyncAlways)
	}
	return opts
}

// writeAuthConf writes, with `torpor creds --server-config`, the auth.conf
// of the bus whose keys are under data/auth to file.
func writeAuthConf(t *testing.T, data, file string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"creds", "--data", data, "--server-config", file}, &stdout, &stderr); code != 0 {
		t.Fatalf("torpor creds --server-config: %d %s", code, stderr.String())
	}
}

// clusterRoutes checks that opts route to the named servers of a cluster
// of three, each at its route port (clusterPort), and listens for routes
// there itself.
func clusterRoutes(t *testing.T, where string, opts *server.Options, servers []string, clusterPort func(host string) int) {
	t.Helper()
	if opts.Cluster.Name == "" {
		t.Errorf("%s: the cluster has no name", where)
	}
	var hosts []string
	for _, r := range opts.Routes {
		hosts = append(hosts, r.Hostname())
		if want := clusterPort(r.Hostname()); r.Port() != strconv.Itoa(want) {
			t.Errorf("%s: route %s: port %s, but %s listens for routes on %d", where, r, r.Port(), r.Hostname(), want)
		}
	}
	slices.Sort(hosts)
	if len(servers) != 3 || !slices.Equal(hosts, servers) {
		t.Errorf("%s: routes to %v, want the three servers %v", where, hosts, servers)
	}
}

// TestDeployNATSCluster: the three servers of deploy/nats/cluster parse
// with nats-server's own reader, each named for itself, each routing to
// all three at the route port they listen on, with JetStream fsyncing
// every write on a store of its own.
func TestDeployNATSCluster(t *testing.T) {
	servers := []string{"n1", "n2", "n3"}
	opts := map[string]*server.Options{}
	stores := map[string]bool{}
	for _, s := range servers {
		o := natsOptions(t, "../../deploy/nats/cluster/"+s+".conf")
		opts[s] = o
		if o.ServerName != s {
			t.Errorf("%s.conf: server_name %q", s, o.ServerName)
		}
		stores[o.StoreDir] = true
	}
	if len(stores) != len(servers) {
		t.Errorf("store dirs %v: want one for each server", stores)
	}
	for _, s := range servers {
		clusterRoutes(t, s+".conf", opts[s], servers, func(h string) int {
			if o := opts[h]; o != nil {
				return o.Cluster.Port
			}
			return -1
		})
		if o := opts[s]; o.Port != 4222 || o.Cluster.Port != 6222 || o.HTTPPort != 8222 || o.Cluster.Name != opts["n1"].Cluster.Name {
			t.Errorf("%s.conf: client %d, routes %d, monitoring %d, cluster %q; want 4222, 6222, 8222 and n1's cluster", s, o.Port, o.Cluster.Port, o.HTTPPort, o.Cluster.Name)
		}
	}
}

// composeFile is what the test reads of deploy/compose.yaml.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string              `yaml:"image"`
	Entrypoint  []string            `yaml:"entrypoint"`
	Command     []string            `yaml:"command"`
	Ports       []string            `yaml:"ports"`
	Volumes     []string            `yaml:"volumes"`
	DependsOn   map[string]struct{} `yaml:"depends_on"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// mount is where a path inside a container comes from: a named volume
// (source without a slash) or a file of the repository (source relative
// to deploy/), and the path below it.
type mount struct{ source, rel string }

// mountOf resolves p inside service s: the deepest of its volumes that
// holds it.
func (s composeService) mountOf(p string) (mount, bool) {
	best, bestLen := mount{}, -1
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 {
			continue
		}
		src, dst := parts[0], parts[1]
		if (p == dst || strings.HasPrefix(p, dst+"/")) && len(dst) > bestLen {
			best, bestLen = mount{src, strings.TrimPrefix(strings.TrimPrefix(p, dst), "/")}, len(dst)
		}
	}
	return best, bestLen >= 0
}

// containerPort is the container's side of each of s's published ports.
func (s composeService) containerPorts() []int {
	var out []int
	for _, p := range s.Ports {
		parts := strings.Split(p, ":")
		if n, err := strconv.Atoi(parts[len(parts)-1]); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// torporImage is the image deploy/Dockerfile builds, whose entrypoint is
// torpor and which holds nats-server beside it.
const torporImage = "torpor:dev"

// TestDeployDockerfile: the image the manifests run is the module's torpor
// and the nats-server of go.mod, with torpor as its entrypoint (which the
// manifests' command lines rely on).
func TestDeployDockerfile(t *testing.T) {
	b, err := os.ReadFile("../../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"go build -trimpath -o /out/torpor ./cmd/torpor", "go build -trimpath -o /out/nats-server github.com/nats-io/nats-server/v2", `ENTRYPOINT ["torpor"]`, "COPY --from=build /out/torpor /out/nats-server /usr/local/bin/"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("deploy/Dockerfile: no %q", want)
		}
	}
	for _, f := range []string{"../../deploy/compose.yaml", "../../deploy/k8s/nats.yaml", "../../deploy/k8s/torpor.yaml", "../../deploy/k8s/driver.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte("image: "+torporImage)) {
			t.Errorf("%s: does not run %s", f, torporImage)
		}
	}
}

// TestDeployCompose: deploy/compose.yaml runs three NATS servers from
// deploy/nats/cluster, three `torpor serve --replicas 3` on them, a driver
// node, CockroachDB, Prometheus and Grafana, and its parts agree: every
// torpor command line parses, every --nats-url names the three servers at
// their client port, the routes and the health checks use the ports the
// servers listen on, Prometheus scrapes every instance at its --http port,
// each credentials file a command reads is written by the creds service
// with the roles that command needs, and the bus's keys are where each
// serve's --data looks for them.
func TestDeployCompose(t *testing.T) {
	b, err := os.ReadFile("../../deploy/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(b, &cf); err != nil {
		t.Fatalf("deploy/compose.yaml: %v", err)
	}
	checkCompose(t, cf)
}

func checkCompose(t *testing.T, cf composeFile) {
	t.Helper()
	type parsed struct {
		name string // the compose service
		line torporLine
	}
	var lines []parsed
	nats := map[string]*server.Options{}
	natsAuth := map[string]mount{} // where each server's include of auth.conf comes from
	var natsNames []string
	for _, name := range sortedKeys(cf.Services) {
		s := cf.Services[name]
		for _, v := range s.Volumes {
			if src := strings.Split(v, ":")[0]; !strings.HasPrefix(src, ".") {
				if _, ok := cf.Volumes[src]; !ok {
					t.Errorf("compose %s: volume %q is not declared", name, src)
				}
			}
		}
		for dep := range s.DependsOn {
			if _, ok := cf.Services[dep]; !ok {
				t.Errorf("compose %s: depends on %q, no such service", name, dep)
			}
		}
		if s.Image != torporImage {
			continue
		}
		switch {
		case len(s.Entrypoint) == 0:
			lines = append(lines, parsed{name: name, line: torporLine{"compose " + name, s.Command}})
		case slices.Equal(s.Entrypoint, []string{"/bin/sh", "-ec"}) && len(s.Command) == 1:
			for _, l := range strings.Split(s.Command[0], "\n") {
				f := strings.Fields(l)
				if len(f) == 0 {
					continue
				}
				if f[0] != "torpor" {
					t.Errorf("compose %s: %q: the script runs torpor lines only (one a line, so that each is checked)", name, l)
					continue
				}
				lines = append(lines, parsed{name: name, line: torporLine{"compose " + name, f[1:]}})
			}
		case slices.Equal(s.Entrypoint, []string{"nats-server"}):
			if len(s.Command) != 2 || s.Command[0] != "-c" {
				t.Errorf("compose %s: nats-server %v: want -c FILE", name, s.Command)
				continue
			}
			m, ok := s.mountOf(s.Command[1])
			if !ok || !strings.HasPrefix(m.source, "./nats/cluster/") || m.rel != "" {
				t.Errorf("compose %s: -c %s: not a file of deploy/nats/cluster mounted there", name, s.Command[1])
				continue
			}
			opts := natsOptions(t, filepath.Join("../../deploy", m.source))
			if opts.ServerName != name {
				t.Errorf("compose %s: runs %s, server_name %q", name, m.source, opts.ServerName)
			}
			nats[name] = opts
			natsNames = append(natsNames, name)
			// Its include: the auth.conf the creds service writes.
			conf, _ := os.ReadFile(filepath.Join("../../deploy", m.source))
			inc := includeRE.FindSubmatch(conf)
			if inc != nil {
				authMount, _ := s.mountOf(path.Join(path.Dir(s.Command[1]), string(inc[1])))
				natsAuth[name] = authMount
			}
			if hc := strings.Join(s.Healthcheck.Test, " "); hc != "" {
				hp := regexp.MustCompile(`http://[^/]+/`).FindString(hc)
				if u, err := url.Parse(hp); err != nil || u.Port() != strconv.Itoa(opts.HTTPPort) {
					t.Errorf("compose %s: health check %q: not nats-server's monitoring port %d", name, hc, opts.HTTPPort)
				}
			}
		default:
			t.Errorf("compose %s: entrypoint %v: want torpor's (none), /bin/sh -ec or nats-server", name, s.Entrypoint)
		}
	}
	if len(natsNames) != 3 {
		t.Fatalf("compose: NATS servers %v, want three", natsNames)
	}
	for _, n := range natsNames {
		clusterRoutes(t, "compose "+n, nats[n], natsNames, func(h string) int {
			if o := nats[h]; o != nil {
				return o.Cluster.Port
			}
			return -1
		})
	}
	checkNATSURL := func(l torporLine, c *cobra.Command) {
		var hosts []string
		for _, hp := range natsURLs(t, l.where, flagString(t, c, "nats-url")) {
			hosts = append(hosts, hp.host)
			if o := nats[hp.host]; o == nil || o.Port != hp.port {
				t.Errorf("%s: --nats-url %s:%d: no NATS server listens there", l.where, hp.host, hp.port)
			}
		}
		slices.Sort(hosts)
		if !slices.Equal(hosts, natsNames) {
			t.Errorf("%s: --nats-url names %v, want every server %v", l.where, hosts, natsNames)
		}
	}

	// What the creds service writes: credentials files by their mount, with
	// their roles and node; the bus's keys; the servers' auth.conf.
	type written struct{ roles, node string }
	creds := map[mount]written{}
	var keys, authConf []mount
	serves := map[string]*cobra.Command{}
	var drivers []*cobra.Command
	for _, p := range lines {
		c := parseTorpor(t, p.line)
		if c == nil {
			continue
		}
		s := cf.Services[p.name]
		data := flagString(t, c, "data")
		switch c.Name() {
		case "creds":
			km, ok := s.mountOf(data + "/auth")
			if !ok || km.rel != "" {
				t.Errorf("%s: --data %s: its auth/ is not a volume of its own", p.line, data)
			}
			keys = append(keys, km)
			if sc := flagString(t, c, "server-config"); sc != "" {
				m, _ := s.mountOf(sc)
				authConf = append(authConf, m)
			}
			if out := flagString(t, c, "output"); out != "" {
				m, ok := s.mountOf(out)
				if !ok {
					t.Errorf("%s: -o %s: not on a volume", p.line, out)
				}
				creds[m] = written{strings.Join(flagSlice(t, c, "role"), ","), flagString(t, c, "node")}
			}
		case "serve", "driver":
			checkNATSURL(p.line, c)
			cr := flagString(t, c, "nats-creds")
			m, _ := s.mountOf(cr)
			w, ok := creds[m]
			want := written{"service", ""}
			if c.Name() == "driver" {
				want = written{"driver", flagString(t, c, "node")}
				drivers = append(drivers, c)
			} else {
				serves[p.name] = c
				km, ok := s.mountOf(data + "/auth")
				if !ok || km.rel != "" || !slices.Contains(keys, km) {
					t.Errorf("%s: --data %s: the bus's keys are not its auth/ (a serve without them cannot mint its supervisors' users)", p.line, data)
				}
			}
			if !ok || w != want {
				t.Errorf("%s: --nats-creds %s: written %+v by the creds service, want roles %+v", p.line, cr, w, want)
			}
		}
	}
	for _, n := range natsNames {
		if !slices.Contains(authConf, natsAuth[n]) {
			t.Errorf("compose %s: its include %+v is not the auth.conf the creds service writes (%+v)", n, natsAuth[n], authConf)
		}
	}
	if len(serves) != 3 || len(drivers) != 1 {
		t.Fatalf("compose: %d serves and %d drivers, want 3 and 1", len(serves), len(drivers))
	}
	// A worker holds its own driver credentials only: not the service's,
	// not the bus's keys (which would give it the whole bus).
	for name, s := range cf.Services {
		if len(s.Command) == 0 || s.Command[0] != "driver" || s.Entrypoint != nil {
			continue
		}
		node := ""
		for i, a := range s.Command {
			if a == "--node" && i+1 < len(s.Command) {
				node = s.Command[i+1]
			}
		}
		for _, v := range s.Volumes {
			src := strings.Split(v, ":")[0]
			if slices.ContainsFunc(keys, func(m mount) bool { return m.source == src }) || slices.ContainsFunc(authConf, func(m mount) bool { return m.source == src }) {
				t.Errorf("compose %s: mounts %s, the bus's keys or the servers' auth", name, src)
			}
			for m, w := range creds {
				if m.source == src && w != (written{"driver", node}) {
					t.Errorf("compose %s: mounts %s, which holds %s (roles %s): not its own driver credentials", name, src, m.rel, w.roles)
				}
			}
		}
	}

	// The serves: R3, the worker driven, the HTTP port published and
	// scraped.
	prom := prometheusTargets(t)
	scraped := map[string]int{}
	for _, tg := range prom.targets {
		hp := splitHostPort(t, "prometheus.yml", tg)
		scraped[hp.host] = hp.port
	}
	for name, c := range serves {
		if r, _ := c.Flags().GetInt("replicas"); r != 3 {
			t.Errorf("compose %s: --replicas %d, want 3 (one copy on each server)", name, r)
		}
		for _, d := range drivers {
			if node := flagString(t, d, "node"); !slices.Contains(flagSlice(t, c, "remote-nodes"), node) {
				t.Errorf("compose %s: --remote-nodes %v: not the driver's node %s", name, flagSlice(t, c, "remote-nodes"), node)
			}
		}
		hp := splitHostPort(t, "compose "+name, flagString(t, c, "http"))
		if !slices.Contains(cf.Services[name].containerPorts(), hp.port) {
			t.Errorf("compose %s: --http port %d is not published (%v)", name, hp.port, cf.Services[name].Ports)
		}
		if port, ok := scraped[name]; !ok || port != hp.port {
			t.Errorf("compose %s: Prometheus scrapes %v, not %s:%d", name, prom.targets, name, hp.port)
		}
		if !slices.Contains(flagSlice(t, c, "http-host"), name) {
			t.Errorf("compose %s: --http-host %v: Prometheus asks for it as %s, which it would refuse", name, flagSlice(t, c, "http-host"), name)
		}
		if open, _ := c.Flags().GetBool("metrics-open"); !open && !prom.authorized {
			t.Errorf("compose %s: /metrics wants a token and Prometheus sends none", name)
		}
		if db := flagString(t, c, "projection-db"); db != "" {
			u, err := url.Parse(db)
			if err != nil || cf.Services[u.Hostname()].Image == "" || u.Port() != "26257" {
				t.Errorf("compose %s: --projection-db %s: not CockroachDB's SQL port (26257) of a service", name, db)
			}
		}
	}
	for name := range scraped {
		if serves[name] == nil {
			t.Errorf("prometheus.yml: scrapes %s, not a torpor serve", name)
		}
	}

	// Grafana: the Prometheus data source at its port, the board loaded.
	var ds struct {
		Datasources []struct {
			URL string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readYAML(t, "../../deploy/grafana/provisioning/datasources/prometheus.yaml", &ds)
	if len(ds.Datasources) != 1 {
		t.Fatalf("grafana data sources %v, want Prometheus", ds)
	}
	u, err := url.Parse(ds.Datasources[0].URL)
	if p, _ := strconv.Atoi(u.Port()); err != nil || !slices.Contains(cf.Services[u.Hostname()].containerPorts(), p) || !strings.HasPrefix(cf.Services[u.Hostname()].Image, "prom/prometheus") {
		t.Errorf("grafana's data source %s: not the Prometheus service's port", ds.Datasources[0].URL)
	}
	var dash struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, "../../deploy/grafana/provisioning/dashboards/torpor.yaml", &dash)
	g := cf.Services["grafana"]
	if m, ok := g.mountOf(dash.Providers[0].Options.Path + "/torpor.json"); !ok || m.source != "./grafana/torpor.json" {
		t.Errorf("grafana: the board is not in its provider's path %s", dash.Providers[0].Options.Path)
	}
	if m, ok := g.mountOf("/etc/grafana/provisioning/datasources/prometheus.yaml"); !ok || m.source != "./grafana/provisioning" {
		t.Errorf("grafana: deploy/grafana/provisioning is not its provisioning")
	}
}

// promConfig is what the test reads of deploy/prometheus/prometheus.yml.
type promConfig struct {
	targets    []string
	authorized bool
}

func prometheusTargets(t *testing.T) promConfig {
	t.Helper()
	var pc struct {
		ScrapeConfigs []struct {
			MetricsPath   string         `yaml:"metrics_path"`
			Authorization map[string]any `yaml:"authorization"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "../../deploy/prometheus/prometheus.yml", &pc)
	if len(pc.ScrapeConfigs) != 1 || pc.ScrapeConfigs[0].MetricsPath != "/metrics" {
		t.Fatalf("prometheus.yml: want one job scraping /metrics: %+v", pc)
	}
	out := promConfig{authorized: pc.ScrapeConfigs[0].Authorization != nil}
	for _, sc := range pc.ScrapeConfigs[0].StaticConfigs {
		out.targets = append(out.targets, sc.Targets...)
	}
	return out
}

// TestDeployPromtool: promtool (Debian's prometheus package, which .ci/run
// installs) finds deploy/prometheus/prometheus.yml valid.
func TestDeployPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found (Debian's prometheus package; .ci/run installs it)")
		}
		t.Skip("!!! promtool not found: prometheus.yml NOT checked. Install it: apt-get install -y --no-install-recommends prometheus !!!")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, promtool, "check", "config", "--syntax-only", "../../deploy/prometheus/prometheus.yml").CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}

func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The Kubernetes manifests, as far as the test reads them.
type (
	kustomization struct {
		Namespace          string   `yaml:"namespace"`
		Resources          []string `yaml:"resources"`
		ConfigMapGenerator []struct {
			Name     string   `yaml:"name"`
			Files    []string `yaml:"files"`
			Literals []string `yaml:"literals"`
		} `yaml:"configMapGenerator"`
		SecretGenerator []struct {
			Name  string   `yaml:"name"`
			Files []string `yaml:"files"`
		} `yaml:"secretGenerator"`
	}
	k8sObject struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name   string            `yaml:"name"`
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			Replicas     int               `yaml:"replicas"`
			ServiceName  string            `yaml:"serviceName"`
			ClusterIP    string            `yaml:"clusterIP"`
			MinAvailable int               `yaml:"minAvailable"`
			Selector     k8sSelector       `yaml:"selector"`
			Ports        []k8sServicePort  `yaml:"ports"`
			Template     k8sPodTemplate    `yaml:"template"`
			NodeSelector map[string]string `yaml:"nodeSelector"`
		} `yaml:"spec"`
	}
	k8sSelector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
		// A Service's selector is its labels themselves.
		Inline map[string]string `yaml:",inline"`
	}
	k8sServicePort struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort string `yaml:"targetPort"`
	}
	k8sPodTemplate struct {
		Metadata struct {
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"metadata"`
		Spec struct {
			Containers []k8sContainer `yaml:"containers"`
			Volumes    []k8sVolume    `yaml:"volumes"`
		} `yaml:"spec"`
	}
	k8sContainer struct {
		Name    string   `yaml:"name"`
		Image   string   `yaml:"image"`
		Command []string `yaml:"command"`
		Args    []string `yaml:"args"`
		Env     []struct {
			Name      string `yaml:"name"`
			Value     string `yaml:"value"`
			ValueFrom struct {
				FieldRef struct {
					FieldPath string `yaml:"fieldPath"`
				} `yaml:"fieldRef"`
				ConfigMapKeyRef struct {
					Name string `yaml:"name"`
					Key  string `yaml:"key"`
				} `yaml:"configMapKeyRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		StartupProbe   *k8sProbe `yaml:"startupProbe"`
		ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
		LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
		VolumeMounts   []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
	}
	k8sProbe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
	}
	k8sVolume struct {
		Name   string `yaml:"name"`
		Secret *struct {
			SecretName string    `yaml:"secretName"`
			Items      []k8sItem `yaml:"items"`
		} `yaml:"secret"`
		Projected *struct {
			Sources []struct {
				ConfigMap *struct {
					Name  string    `yaml:"name"`
					Items []k8sItem `yaml:"items"`
				} `yaml:"configMap"`
				Secret *struct {
					Name  string    `yaml:"name"`
					Items []k8sItem `yaml:"items"`
				} `yaml:"secret"`
			} `yaml:"sources"`
		} `yaml:"projected"`
	}
	k8sItem struct {
		Key  string `yaml:"key"`
		Path string `yaml:"path"`
	}
)

// port is the container's port named name.
func (c k8sContainer) port(name string) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return -1
}

// volumeAt is the volume mounted at dir in pod spec p's container c.
func volumeAt(p k8sPodTemplate, c k8sContainer, dir string) (k8sVolume, bool) {
	for _, m := range c.VolumeMounts {
		if m.MountPath == dir {
			for _, v := range p.Spec.Volumes {
				if v.Name == m.Name {
					return v, true
				}
			}
		}
	}
	return k8sVolume{}, false
}

// readK8s reads deploy/k8s: the kustomization and every object of its
// resources, by kind and name.
func readK8s(t *testing.T, dir string) (kustomization, map[string]k8sObject) {
	t.Helper()
	var k kustomization
	readYAML(t, filepath.Join(dir, "kustomization.yaml"), &k)
	objs := map[string]k8sObject{}
	for _, r := range k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		d := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			err := d.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("deploy/k8s/%s: %v", r, err)
			}
			if o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("deploy/k8s/%s: an object without kind or name", r)
			}
			objs[o.Kind+"/"+o.Metadata.Name] = o
		}
	}
	return k, objs
}

// TestDeployK8s: the Kubernetes manifests run NATS as a StatefulSet of
// three from deploy/k8s/nats.conf, torpor as a Deployment of three
// (`serve --replicas 3`) with a PodDisruptionBudget of two and probes on
// /readyz and /healthz, and the driver as a DaemonSet; every torpor
// command line parses, and ports, routes, probes, Services and the
// credentials mounted agree with what each side listens on or reads.
func TestDeployK8s(t *testing.T) {
	checkK8s(t, "../../deploy/k8s")
}

func checkK8s(t *testing.T, dir string) {
	t.Helper()
	k, objs := readK8s(t, dir)
	get := func(key string) k8sObject {
		t.Helper()
		o, ok := objs[key]
		if !ok {
			t.Fatalf("deploy/k8s: no %s", key)
		}
		return o
	}
	literals := map[string]string{}
	configFiles := map[string]string{}
	for _, g := range k.ConfigMapGenerator {
		for _, l := range g.Literals {
			key, v, _ := strings.Cut(l, "=")
			literals[g.Name+"/"+key] = v
		}
		for _, f := range g.Files {
			configFiles[g.Name+"/"+path.Base(f)] = f
		}
	}
	secrets := map[string][]string{}
	for _, g := range k.SecretGenerator {
		for _, f := range g.Files {
			secrets[g.Name] = append(secrets[g.Name], path.Base(f))
		}
	}

	// NATS: the StatefulSet, its headless Service, its configuration.
	sts, svc := get("StatefulSet/nats"), get("Service/nats")
	if sts.Spec.Replicas != 3 || sts.Spec.ServiceName != svc.Metadata.Name || svc.Spec.ClusterIP != "None" {
		t.Errorf("StatefulSet nats: %d replicas, service %q (headless %q); want 3 on the headless Service nats", sts.Spec.Replicas, sts.Spec.ServiceName, svc.Spec.ClusterIP)
	}
	nc := sts.Spec.Template.Spec.Containers[0]
	if !slices.Equal(nc.Command, []string{"nats-server"}) || len(nc.Args) != 2 || nc.Args[0] != "-c" {
		t.Fatalf("StatefulSet nats: runs %v %v, want nats-server -c FILE", nc.Command, nc.Args)
	}
	confDir := path.Dir(nc.Args[1])
	cv, ok := volumeAt(sts.Spec.Template, nc, confDir)
	if !ok || cv.Projected == nil {
		t.Fatalf("StatefulSet nats: nothing projected at %s", confDir)
	}
	var confFile string
	authConf := map[string]bool{}
	for _, src := range cv.Projected.Sources {
		if cm := src.ConfigMap; cm != nil {
			for _, it := range cm.Items {
				if it.Path == path.Base(nc.Args[1]) {
					confFile = configFiles[cm.Name+"/"+it.Key]
				}
			}
		}
		if s := src.Secret; s != nil {
			for _, it := range s.Items {
				if slices.Contains(secrets[s.Name], it.Key) {
					authConf[it.Path] = true
				}
			}
		}
	}
	if confFile == "" {
		t.Fatalf("StatefulSet nats: -c %s is not a file of a generated ConfigMap", nc.Args[1])
	}
	conf, err := os.ReadFile(filepath.Join(dir, confFile))
	if err != nil {
		t.Fatal(err)
	}
	if inc := includeRE.FindSubmatch(conf); inc == nil || !authConf[path.Clean(string(inc[1]))] {
		t.Errorf("deploy/k8s/%s: its include is not the auth.conf of a Secret projected beside it (%v)", confFile, authConf)
	}
	podName := func(i int) string { return sts.Metadata.Name + "-" + strconv.Itoa(i) }
	t.Setenv("POD_NAME", podName(0))
	opts := natsOptions(t, filepath.Join(dir, confFile))
	if opts.ServerName != podName(0) {
		t.Errorf("deploy/k8s/%s: server_name %q in pod %s", confFile, opts.ServerName, podName(0))
	}
	var servers []string
	for i := range sts.Spec.Replicas {
		servers = append(servers, podName(i)+"."+svc.Metadata.Name)
	}
	clusterRoutes(t, "deploy/k8s/"+confFile, opts, servers, func(string) int { return opts.Cluster.Port })
	for name, want := range map[string]int{"client": opts.Port, "cluster": opts.Cluster.Port, "monitor": opts.HTTPPort} {
		if got := nc.port(name); got != want {
			t.Errorf("StatefulSet nats: port %s %d, nats-server listens on %d", name, got, want)
		}
		if !slices.ContainsFunc(svc.Spec.Ports, func(p k8sServicePort) bool { return p.Port == want && p.TargetPort == name }) {
			t.Errorf("Service nats: no port %d to %s", want, name)
		}
	}
	for _, p := range []*k8sProbe{nc.StartupProbe, nc.ReadinessProbe, nc.LivenessProbe} {
		if p != nil && (p.HTTPGet.Port != "monitor" || !strings.HasPrefix(p.HTTPGet.Path, "/healthz")) {
			t.Errorf("StatefulSet nats: a probe on %s %s, want nats-server's /healthz on monitor", p.HTTPGet.Port, p.HTTPGet.Path)
		}
	}
	natsURL := func(l torporLine, c *cobra.Command) {
		var hosts []string
		for _, hp := range natsURLs(t, l.where, flagString(t, c, "nats-url")) {
			hosts = append(hosts, hp.host)
			if hp.port != opts.Port {
				t.Errorf("%s: --nats-url port %d, nats-server listens on %d", l.where, hp.port, opts.Port)
			}
		}
		if !slices.Equal(hosts, servers) {
			t.Errorf("%s: --nats-url names %v, want every server %v", l.where, hosts, servers)
		}
	}

	// A container's torpor line: its args with $(VAR) expanded as the
	// kubelet does, from the container's env (a fieldRef stands for the
	// first remote node or the pod's name).
	line := func(kind string, o k8sObject, c k8sContainer) torporLine {
		if c.Image != torporImage || len(c.Command) != 0 {
			t.Fatalf("%s %s: container %s runs %s %v, want torpor's image and entrypoint", kind, o.Metadata.Name, c.Name, c.Image, c.Command)
		}
		env := map[string]string{}
		for _, e := range c.Env {
			switch {
			case e.ValueFrom.ConfigMapKeyRef.Name != "":
				v, ok := literals[e.ValueFrom.ConfigMapKeyRef.Name+"/"+e.ValueFrom.ConfigMapKeyRef.Key]
				if !ok {
					t.Errorf("%s %s: env %s: no such ConfigMap key", kind, o.Metadata.Name, e.Name)
				}
				env[e.Name] = v
			case e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
				env[e.Name] = strings.Split(literals["torpor-config/remote-nodes"], ",")[0]
			case e.ValueFrom.FieldRef.FieldPath != "":
				env[e.Name] = o.Metadata.Name + "-0"
			default:
				env[e.Name] = e.Value
			}
		}
		var args []string
		for _, a := range c.Args {
			args = append(args, regexp.MustCompile(`\$\(([A-Z_]+)\)`).ReplaceAllStringFunc(a, func(m string) string {
				v, ok := env[m[2:len(m)-1]]
				if !ok {
					t.Errorf("%s %s: %s: no env %s", kind, o.Metadata.Name, a, m)
				}
				return v
			}))
		}
		return torporLine{"deploy/k8s " + kind + " " + o.Metadata.Name, args}
	}
	// credsIn checks that the file a torpor line reads is in a Secret the
	// kustomization generates, mounted at its directory.
	credsIn := func(l torporLine, o k8sObject, c k8sContainer, file string) {
		v, ok := volumeAt(o.Spec.Template, c, path.Dir(file))
		if !ok || v.Secret == nil {
			t.Errorf("%s: %s: no Secret mounted at %s", l, file, path.Dir(file))
			return
		}
		key := path.Base(file)
		for _, it := range v.Secret.Items {
			if it.Path == key {
				key = it.Key
			}
		}
		if !slices.Contains(secrets[v.Secret.SecretName], key) {
			t.Errorf("%s: %s: Secret %s holds %v", l, file, v.Secret.SecretName, secrets[v.Secret.SecretName])
		}
	}

	// torpor serve: the Deployment, its Service, its budget.
	dep, tsvc, pdb := get("Deployment/torpor"), get("Service/torpor"), get("PodDisruptionBudget/torpor")
	tc := dep.Spec.Template.Spec.Containers[0]
	l := line("Deployment", dep, tc)
	if c := parseTorpor(t, l); c != nil {
		if c.Name() != "serve" {
			t.Fatalf("%s: want serve", l)
		}
		natsURL(l, c)
		if r, _ := c.Flags().GetInt("replicas"); r != 3 || r > sts.Spec.Replicas {
			t.Errorf("%s: --replicas %d, want 3 (one copy on each of the %d servers)", l, r, sts.Spec.Replicas)
		}
		credsIn(l, dep, tc, flagString(t, c, "nats-creds"))
		data := flagString(t, c, "data")
		kv, ok := volumeAt(dep.Spec.Template, tc, data+"/auth")
		keys := []string{busauth.OperatorFile, busauth.AccountFile, busauth.SystemFile, busauth.ClientsFile}
		if !ok || kv.Secret == nil || !slices.Equal(secrets[kv.Secret.SecretName], keys) {
			t.Errorf("%s: --data %s: the bus's keys %v are not mounted as its auth/", l, data, keys)
		}
		hp := splitHostPort(t, l.where, flagString(t, c, "http"))
		if tc.port("http") != hp.port {
			t.Errorf("%s: --http port %d, the container's port http is %d", l, hp.port, tc.port("http"))
		}
		if a := dep.Spec.Template.Metadata.Annotations; a["prometheus.io/port"] != strconv.Itoa(hp.port) || a["prometheus.io/path"] != "/metrics" {
			t.Errorf("Deployment torpor: Prometheus annotations %v, want /metrics on %d", a, hp.port)
		}
		if open, _ := c.Flags().GetBool("metrics-open"); !open {
			t.Errorf("%s: /metrics wants a token, which the annotated scrape does not send", l)
		}
		for _, h := range []string{tsvc.Metadata.Name, tsvc.Metadata.Name + "." + k.Namespace + ".svc"} {
			if !slices.Contains(flagSlice(t, c, "http-host"), h) {
				t.Errorf("%s: --http-host lacks %s, the Service's name clients use", l, h)
			}
		}
	}
	for probe, p := range map[string]*k8sProbe{"/readyz": tc.ReadinessProbe, "/healthz": tc.LivenessProbe} {
		if p == nil || p.HTTPGet.Path != probe || p.HTTPGet.Port != "http" {
			t.Errorf("Deployment torpor: want a probe on %s of port http, have %+v", probe, p)
		}
	}
	if dep.Spec.Replicas != 3 || pdb.Spec.MinAvailable != 2 || !labelsMatch(pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Metadata.Labels) {
		t.Errorf("Deployment torpor: %d replicas, budget minAvailable %d over %v; want 3, 2 over its pods", dep.Spec.Replicas, pdb.Spec.MinAvailable, pdb.Spec.Selector.MatchLabels)
	}
	if len(tsvc.Spec.Ports) != 1 || tsvc.Spec.Ports[0].TargetPort != "http" || !labelsMatch(tsvc.Spec.Selector.Inline, dep.Spec.Template.Metadata.Labels) {
		t.Errorf("Service torpor: %+v, want its pods' port http", tsvc.Spec)
	}

	// torpor driver: the DaemonSet, driven by every serve.
	ds := get("DaemonSet/torpor-driver")
	dc := ds.Spec.Template.Spec.Containers[0]
	dl := line("DaemonSet", ds, dc)
	if c := parseTorpor(t, dl); c != nil {
		if c.Name() != "driver" {
			t.Fatalf("%s: want driver", dl)
		}
		natsURL(dl, c)
		credsIn(dl, ds, dc, flagString(t, c, "nats-creds"))
		if node := flagString(t, c, "node"); !strings.Contains(flagString(t, c, "nats-creds"), node) {
			t.Errorf("%s: --nats-creds is not the node's own (torpor creds --role driver --node %s)", dl, node)
		}
	}
	if !slices.Contains(dc.Args, "--node=$(NODE_NAME)") {
		t.Errorf("DaemonSet torpor-driver: its --node is not the Kubernetes node's name: %v", dc.Args)
	}
	// A worker holds drivers' credentials only: not the service's, not the
	// bus's keys (which would give it the whole bus).
	workers := strings.Split(literals["torpor-config/remote-nodes"], ",")
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, f := range secrets[v.Secret.SecretName] {
			if !slices.Contains(workers, strings.TrimSuffix(f, ".creds")) {
				t.Errorf("DaemonSet torpor-driver: mounts Secret %s, which holds %s: not a worker's driver credentials", v.Secret.SecretName, f)
			}
		}
	}
}

// labelsMatch says whether every label of sel is in labels (and sel has some).
func labelsMatch(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestDeployKustomize: `kubectl kustomize` (Debian's kubernetes-client,
// which .ci/run installs) builds deploy/k8s, with the secrets written by
// `torpor creds` as deploy/README.md says.
func TestDeployKustomize(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kubectl not found (Debian's kubernetes-client package; .ci/run installs it)")
		}
		t.Skip("!!! kubectl not found: deploy/k8s NOT built with kustomize (the manifests are still read by TestDeployK8s). Install it: apt-get install -y --no-install-recommends kubernetes-client !!!")
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("../../deploy/k8s")); err != nil {
		t.Fatal(err)
	}
	writeK8sSecrets(t, filepath.Join(dir, "secrets"), "worker-1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kubectl, "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	for _, want := range []string{"kind: StatefulSet", "kind: Deployment", "kind: DaemonSet", "kind: PodDisruptionBudget", "kind: Secret", "namespace: torpor"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kubectl kustomize: no %q", want)
		}
	}
}

// writeK8sSecrets writes into dir what deploy/README.md has the operator
// write for deploy/k8s: the bus's keys, auth.conf, the service's and each
// worker's credentials.
func writeK8sSecrets(t *testing.T, dir string, workers ...string) {
	t.Helper()
	data := t.TempDir()
	writeAuthConf(t, data, filepath.Join(dir, "auth.conf"))
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(data, "auth"))); err != nil {
		t.Fatal(err)
	}
	mint := func(out string, args ...string) {
		var stdout, stderr strings.Builder
		if code := run(context.Background(), append([]string{"creds", "--data", data, "-o", filepath.Join(dir, out)}, args...), &stdout, &stderr); code != 0 {
			t.Fatalf("torpor creds %v: %s", args, stderr.String())
		}
	}
	mint("service.creds", "--role", "service")
	for _, w := range workers {
		mint(w+".creds", "--role", "driver", "--node", w)
	}
}

// TestDeployProbesServed: what the manifests probe and scrape a serve on
// (/readyz, /healthz, /metrics with --metrics-open) answers 200 without a
// token, addressed by the pod's IP as the kubelet does.
func TestDeployProbesServed(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) { c.MetricsOpen = true })
	for _, p := range []string{"/readyz", "/healthz", "/metrics"} {
		resp, err := http.Get("http://" + a.HTTPAddr() + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", p, resp.StatusCode)
		}
	}
}

// TestDeployREADMECommands: every torpor command line of deploy/README.md's
// examples parses with the cobra command of its verb, and every
// nats-server config it runs exists.
func TestDeployREADMECommands(t *testing.T) {
	b, err := os.ReadFile("../../deploy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for i, l := range strings.Split(string(b), "\n") {
		l, _, _ = strings.Cut(l, " #") // a comment
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		where := "deploy/README.md:" + strconv.Itoa(i+1)
		switch f[0] {
		case "torpor":
			seen++
			parseTorpor(t, torporLine{where, f[1:]})
		case "nats-server":
			if len(f) != 3 || f[1] != "-c" {
				t.Errorf("%s: %s: want nats-server -c FILE", where, l)
			} else if _, err := os.Stat(filepath.Join("../..", f[2])); err != nil {
				t.Errorf("%s: %v", where, err)
			}
		}
	}
	if seen == 0 {
		t.Fatal("deploy/README.md: no torpor command line")
	}
}

// TestDeployComposeConfig: docker-compose (Debian's package, which .ci/run
// installs) finds deploy/compose.yaml valid: `docker-compose config -q`
// checks it against the compose file's schema without a Docker daemon.
func TestDeployComposeConfig(t *testing.T) {
	dc, err := exec.LookPath("docker-compose")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("docker-compose not found (Debian's docker-compose package; .ci/run installs it)")
		}
		t.Skip("!!! docker-compose not found: deploy/compose.yaml NOT checked against the compose schema. Install it: apt-get install -y --no-install-recommends docker-compose !!!")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, dc, "-f", "../../deploy/compose.yaml", "config", "-q").CombinedOutput(); err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, out)
	}
}
