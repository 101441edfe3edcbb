package busauth

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Role is what a user of the torpor account is for.
type Role string

// The roles. A user may hold several; its permissions are their union.
const (
	// Service is torpor's own connections: everything in the account. The
	// only role that writes the stream, the buckets and the object store,
	// or reads torpor_config.
	Service Role = "service"
	// Producer sends commands (torpor.cmd.>) and reads their answers; it
	// may list the services on the bus (`nats micro ls`, $SRV.>).
	Producer Role = "producer"
	// Dashboard reads the phase view bucket and the event stream through
	// consumers it makes and direct gets: nothing it can write.
	Dashboard Role = "dashboard"
	// Driver serves one node's drivers (torpor.driver.<node>.>).
	Driver Role = "driver"
	// Supervisor reports for one sandbox (torpor.supervisor.<id>).
	Supervisor Role = "supervisor"
	// ClientsService is torpor's own connection in the clients' account,
	// which makes the copies there (Copies): everything in that account.
	ClientsService Role = "clients-service"
)

// clients says whether a user holding r belongs to the clients' account.
func (r Role) clients() bool {
	return r == Producer || r == Dashboard || r == ClientsService
}

// Roles are the roles `torpor creds` mints (a supervisor's credential is
// minted by the service, for one generation).
var Roles = []Role{Service, Producer, Dashboard, Driver}

// Subjects and names of torpor the permissions speak of.
const (
	EventStream    = "TORPOR_EVENTS"
	PhaseBucket    = "torpor_phases"
	SnapshotBucket = "torpor_snapshots"
)

// The inbox prefixes: a request's answer comes back on an inbox of its
// sender, which no other user may read: the service's reads of
// torpor_config, a driver's snapshots, a producer's answers. Each client
// (producer, dashboard) has one of its own (ClientInbox); the service,
// drivers and supervisors have theirs.
const (
	DefaultInbox = "_INBOX"
	// ServiceInbox is the inbox of torpor's own connections: a request
	// in the torpor account whose reply is not on it is not the service's
	// (a push consumer's delivery a driver aimed at the command or driver
	// subjects), and the gateway and the drivers refuse it.
	ServiceInbox = serviceInbox
	serviceInbox = "_TORPOR_SVC"
	driverInbox  = "_TORPOR_DRV"
	supervInbox  = "_TORPOR_SUP"
)

// Grant is one role of a user with what it is scoped to.
type Grant struct {
	Role Role
	// Node is the driver's node.
	Node string
	// Sandbox is the supervisor's sandbox id.
	Sandbox string
	// SimReports lets a driver publish supervisor reports for any sandbox
	// (torpor.supervisor.*): what the sim driver of a driver node needs,
	// being its own sandboxes' supervisor (`torpor creds --role driver
	// --node N --sim-reports`). Without it the server refuses a driver's
	// every report; the process and vm drivers need none (their
	// supervisors connect as users of their own sandbox, which the service
	// mints per generation).
	//
	// Why an opt-in and not the alternatives: a report through a per-sandbox
	// supervisor user would cost the sim a connection per sandbox (or a
	// connect per report) on the path the bench measures, and a report
	// relayed on the driver's own subject would make the service, not the
	// server, refuse another node's sandbox. The opt-in keeps every driver
	// that runs real workloads (process, vm) without any report permission,
	// and leaves the sim (which runs nothing) where it was: a report still
	// needs its generation's credential, which only the service mints.
	SimReports bool
}

// Validate reports whether g is a role with its scope.
func (g Grant) Validate() error {
	switch g.Role {
	case Service, Producer, Dashboard, ClientsService:
		if g.Node != "" || g.Sandbox != "" {
			return fmt.Errorf("role %s: takes no node or sandbox", g.Role)
		}
		if g.SimReports {
			return fmt.Errorf("role %s: sim reports are a driver's", g.Role)
		}
	case Driver:
		if err := token("node", g.Node); err != nil {
			return fmt.Errorf("role driver: %w", err)
		}
	case Supervisor:
		if err := token("sandbox", g.Sandbox); err != nil {
			return fmt.Errorf("role supervisor: %w", err)
		}
		if g.SimReports {
			return errors.New("role supervisor: sim reports are a driver's")
		}
	default:
		return fmt.Errorf("unknown role %q (want one of service, producer, dashboard, driver, supervisor)", g.Role)
	}
	return nil
}

// token checks that v is one token of a subject.
func token(what, v string) error {
	if v == "" {
		return fmt.Errorf("no %s", what)
	}
	if strings.ContainsAny(v, ".*> \t\r\n") {
		return fmt.Errorf("%s %q: want one subject token (no '.', '*', '>' or spaces)", what, v)
	}
	return nil
}

// Inbox is the inbox prefix a connection holding grants must use
// (nats.CustomInboxPrefix): its answers come back where only it may read.
func Inbox(grants ...Grant) string {
	for _, g := range grants {
		if g.Role == Service || g.Role == ClientsService {
			return serviceInbox
		}
	}
	for _, g := range grants {
		if g.Role == Producer || g.Role == Dashboard {
			return DefaultInbox
		}
	}
	for _, g := range grants {
		switch g.Role {
		case Driver:
			return driverInbox + "." + g.Node
		case Supervisor:
			return supervInbox + "." + g.Sandbox
		}
	}
	return DefaultInbox
}

// perms is what a user holding g may publish and subscribe to, and
// whether it may answer the requests it receives; all says it may do
// anything in the account.
type perms struct {
	pub, sub []string
	resp     bool
	all      bool
}

// streamReads are the JetStream API subjects that read stream s through
// consumers the reader makes and deletes (ordered, ephemeral: nats.go
// names them at random, and nobody but the service may list them, so no
// reader finds another's to delete or pull from) and gets, with the flow
// control of push consumers. Subject permissions cannot refuse a durable
// name inside the body of a create, but every consumer counts against the
// account's limit, and the legacy durable subject is not granted.
func streamReads(s string) []string {
	return []string{
		"$JS.API.STREAM.INFO." + s,
		"$JS.API.STREAM.MSG.GET." + s,
		"$JS.API.DIRECT.GET." + s,
		"$JS.API.DIRECT.GET." + s + ".>",
		"$JS.API.CONSUMER.CREATE." + s,
		"$JS.API.CONSUMER.CREATE." + s + ".>",
		"$JS.API.CONSUMER.INFO." + s + ".*",
		"$JS.API.CONSUMER.MSG.NEXT." + s + ".*",
		"$JS.API.CONSUMER.DELETE." + s + ".*",
		"$JS.FC." + s + ".>",
	}
}

func (g Grant) perms() perms {
	switch g.Role {
	case Service, ClientsService:
		return perms{all: true}
	case Producer:
		return perms{
			pub: []string{"torpor.cmd.>", "$SRV.>"},
			sub: []string{DefaultInbox + ".>"},
		}
	case Dashboard:
		pub := []string{"$JS.API.INFO"}
		pub = append(pub, streamReads(EventStream)...)
		pub = append(pub, streamReads("KV_"+PhaseBucket)...)
		return perms{pub: pub, sub: []string{DefaultInbox + ".>"}}
	case Driver:
		obj := "OBJ_" + SnapshotBucket
		p := perms{
			pub: append([]string{
				// The vm driver moves snapshots between nodes through the
				// object store torpor_snapshots, which the service makes:
				// it writes, reads and deletes its objects (a delete
				// purges the object's chunks); nothing else of JetStream.
				"$JS.API.INFO",
				"$JS.API.STREAM.PURGE." + obj,
				"$O." + SnapshotBucket + ".>",
			}, streamReads(obj)...),
			sub: []string{
				"torpor.driver." + g.Node + ".>",
				// micro's discovery endpoints ($SRV.PING, INFO, STATS).
				"$SRV.>",
				driverInbox + "." + g.Node + ".>",
			},
			resp: true,
		}
		if g.SimReports {
			// The sim driver is its own sandboxes' supervisor: it
			// reports for them (each report still carries the
			// generation's credential, which only the service mints).
			p.pub = append(p.pub, ReportSubjects)
		}
		return p
	case Supervisor:
		return perms{
			pub: []string{"torpor.supervisor." + g.Sandbox},
			sub: []string{supervInbox + "." + g.Sandbox + ".>"},
		}
	}
	return perms{}
}

// union is the permissions of every grant.
func union(grants []Grant) perms {
	var u perms
	for _, g := range grants {
		p := g.perms()
		if p.all {
			return p
		}
		u.resp = u.resp || p.resp
		for _, s := range p.pub {
			if !slices.Contains(u.pub, s) {
				u.pub = append(u.pub, s)
			}
		}
		for _, s := range p.sub {
			if !slices.Contains(u.sub, s) {
				u.sub = append(u.sub, s)
			}
		}
	}
	return u
}

// ReportSubjects are the subjects of every sandbox's supervisor reports
// (compute.ReportSubject), which a driver publishes on only with
// SimReports.
const ReportSubjects = "torpor.supervisor.*"

// ParseRoles reads a --role list ("producer,dashboard"); node scopes a
// driver, simReports lets it report for sandboxes (Grant.SimReports).
func ParseRoles(roles []string, node string, simReports bool) ([]Grant, error) {
	if len(roles) == 0 {
		return nil, fmt.Errorf("no role (want one or more of service, producer, dashboard, driver)")
	}
	var out []Grant
	driver := false
	for _, r := range roles {
		g := Grant{Role: Role(strings.TrimSpace(r))}
		if g.Role == Supervisor {
			return nil, fmt.Errorf("role supervisor: minted by the service for one sandbox's generation, not by hand")
		}
		if g.Role == ClientsService {
			return nil, fmt.Errorf("role %s: the service's own, not minted by hand", g.Role)
		}
		if g.Role == Driver {
			g.Node, g.SimReports, driver = node, simReports, true
		}
		if err := g.Validate(); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	if node != "" && !driver {
		return nil, fmt.Errorf("--node: only a driver is scoped to a node")
	}
	if simReports && !driver {
		return nil, fmt.Errorf("--sim-reports: only a driver reports for its sim's sandboxes")
	}
	return out, nil
}
