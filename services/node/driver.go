package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/process"
	"github.com/torpor/torpor/services/compute/remote"
	"github.com/torpor/torpor/services/compute/sim"
)

// DriverNames are the drivers `torpor driver` can serve.
var DriverNames = []string{"sim", "process", "vm"}

// DriverConfig is everything `torpor driver` takes from its flags.
type DriverConfig struct {
	Node    string
	Drivers []string
	NATSURL string
	// NATSCreds is the credentials file to connect with (--nats-creds: a
	// driver user of Node, `torpor creds --role driver --node N`, with
	// --sim-reports when Drivers has the sim).
	NATSCreds string
	// NATSCA is a PEM file of CAs to trust for a NATS server with TLS,
	// besides the system's (--nats-ca); its supervisors trust it too.
	NATSCA string
	Data   string
	// VMKernel is the guest kernel of the vm driver.
	VMKernel string
	// Heartbeat is how often the process driver's supervisors heartbeat
	// (a third of the service's --heartbeat-limit, as serve has it).
	Heartbeat time.Duration
	// Torpor is the torpor binary the process driver's supervisors run;
	// default this executable. No flag sets it.
	Torpor string
	// RunAs is whom the process driver's workloads run as (--run-as).
	RunAs string
	// SimByDefault says Drivers holds the sim by default (--drivers not
	// given), not because it was asked for: a credential that may not
	// report for sandboxes leaves it out, with a warning, rather than
	// stopping the start (simReports).
	SimByDefault bool
	// connected, when set, is given the NATS connection once it is made:
	// the fault tests crash a worker by closing it. No flag sets it.
	connected func(*nats.Conn)
}

// Validate reports the first flag c cannot work with.
func (c DriverConfig) Validate() error {
	switch {
	case !validNode.MatchString(c.Node):
		return fmt.Errorf("--node %q: want 1 to 63 lower-case letters, digits, '-' or '_', starting and ending with a letter or digit (it names subjects: torpor.driver.<node>.<op>)", c.Node)
	case c.NATSURL == "":
		return errors.New("--nats-url: want the URL of the NATS the service runs on")
	case c.Data == "":
		return errors.New("--data: want a directory (not the service's own: its sim journal and process sandboxes would be shared)")
	case c.Heartbeat <= 0:
		return fmt.Errorf("--heartbeat %s: want a positive duration", c.Heartbeat)
	case len(c.Drivers) == 0:
		return fmt.Errorf("--drivers: want one or more of %s", strings.Join(DriverNames, ", "))
	}
	if c.RunAs != "" {
		if _, err := process.LookupUser(c.RunAs); err != nil {
			return fmt.Errorf("--run-as: %w", err)
		}
	}
	for i, name := range c.Drivers {
		switch {
		case !slices.Contains(DriverNames, name):
			return fmt.Errorf("--drivers: unknown driver %q (known: %s)", name, strings.Join(DriverNames, ", "))
		case slices.Contains(c.Drivers[:i], name):
			return fmt.Errorf("--drivers: %q named twice", name)
		}
	}
	if c.VMKernel != "" && !slices.Contains(c.Drivers, "vm") {
		// Else the node would serve no vm driver, silently, and each resume
		// or create there fail with "no driver vm".
		return fmt.Errorf("--vm-kernel %s without vm in --drivers (%s): add vm to --drivers, or leave --vm-kernel out", c.VMKernel, strings.Join(c.Drivers, ","))
	}
	return nil
}

// RunDriver builds cfg's drivers and serves them until ctx ends; it says
// on out when they are served.
func RunDriver(ctx context.Context, cfg DriverConfig, out io.Writer, log zerolog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return invalid(err)
	}
	if slices.Contains(cfg.Drivers, "process") {
		WarnRoot(log, cfg.RunAs)
	}
	opts := []nats.Option{nats.Name("torpor driver " + cfg.Node), nats.MaxReconnects(-1)}
	if cfg.NATSCreds != "" {
		b, err := os.ReadFile(cfg.NATSCreds)
		if err != nil {
			return invalid(fmt.Errorf("--nats-creds: %w", err))
		}
		u, err := busauth.ParseCreds(b, busauth.Grant{Role: busauth.Driver, Node: cfg.Node})
		if err != nil {
			return invalid(fmt.Errorf("--nats-creds %s: %w", cfg.NATSCreds, err))
		}
		if cfg.Drivers, err = simReports(cfg, b, log); err != nil {
			return err
		}
		opts = append(opts, u.Options()...)
	}
	if cfg.NATSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.NATSCA))
	}
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return events.Errorf(events.CodeUnavailable, "connect %s: %v", cfg.NATSURL, err)
	}
	if cfg.connected != nil {
		cfg.connected(nc)
	}
	defer func() {
		_ = nc.FlushTimeout(2 * time.Second)
		nc.Close()
	}()
	drivers, closeDrivers, err := buildDrivers(cfg, nc, log)
	defer closeDrivers()
	if err != nil {
		return err
	}
	var only []remote.ServeOption
	if cfg.NATSCreds != "" {
		// A bus with accounts: the service's requests come answered on its
		// inbox; another node's driver could aim deliveries here.
		only = append(only, remote.OnlyFrom(busauth.ServiceInbox))
	}
	srv, err := remote.Serve(ctx, nc, cfg.Node, drivers, log, only...)
	if err != nil {
		return err
	}
	log.Info().Str("node", cfg.Node).Strs("drivers", drivers.Names()).Str("nats", cfg.NATSURL).Str("data", cfg.Data).Msg("torpor driver serving")
	fmt.Fprintf(out, "torpor driver is up: node %s, drivers %s, NATS on %s\n", cfg.Node, strings.Join(drivers.Names(), ","), cfg.NATSURL)
	<-ctx.Done()
	err = srv.Stop()
	log.Info().Err(err).Msg("torpor driver stopped")
	return err
}

// simReports refuses a sim driver whose credential may not report for its
// sandboxes: the server would refuse each of its reports, and its
// sandboxes would never attach nor exit. A driver user reports only when
// minted so (busauth.Grant.SimReports), which the process and vm drivers
// need not: their supervisors are users of their own sandbox.
// A sim there by default (SimByDefault) is left out instead, with a
// warning, so that `torpor driver` without --drivers serves the process
// driver with a plain driver credential. It returns the drivers to serve.
func simReports(cfg DriverConfig, creds []byte, log zerolog.Logger) ([]string, error) {
	if !slices.Contains(cfg.Drivers, "sim") {
		return cfg.Drivers, nil
	}
	ok, err := busauth.CredsReport(creds)
	switch {
	case err != nil:
		return nil, invalid(fmt.Errorf("--nats-creds %s: %w", cfg.NATSCreds, err))
	case ok:
		return cfg.Drivers, nil
	case cfg.SimByDefault && len(cfg.Drivers) > 1:
		log.Warn().Str("nats_creds", cfg.NATSCreds).Msgf("not serving the sim driver: it reports for its sandboxes (%s), which this credential may not (mint it with `torpor creds --role driver --node %s --sim-reports` to serve it)", busauth.ReportSubjects, cfg.Node)
		return slices.DeleteFunc(slices.Clone(cfg.Drivers), func(d string) bool { return d == "sim" }), nil
	}
	return nil, invalid(fmt.Errorf("--nats-creds %s: the sim driver reports for its sandboxes (%s), which this credential may not: mint it with `torpor creds --role driver --node %s --sim-reports`, or leave sim out of --drivers", cfg.NATSCreds, busauth.ReportSubjects, cfg.Node))
}

// buildDrivers makes the drivers cfg names, as serve makes them: the sim
// reports for its sandboxes on nc, the process driver's supervisors dial
// cfg's NATS. The returned close releases what they hold, also on error.
func buildDrivers(cfg DriverConfig, nc *nats.Conn, log zerolog.Logger) (compute.Registry, func(), error) {
	drivers := compute.Registry{}
	var closers []func()
	closeAll := func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	for _, name := range cfg.Drivers {
		var (
			d   compute.Driver
			err error
		)
		switch name {
		case "sim":
			var s *sim.Driver
			if s, err = sim.New(busReporter(nc), sim.Config{Data: cfg.Data}); err == nil {
				d = s
				closers = append(closers, s.Close)
			}
		case "process":
			// Stopping `torpor driver` leaves the sandboxes running: a
			// restart on the same --data finds them.
			d, err = process.New(process.Config{Data: cfg.Data, NATSURL: cfg.NATSURL, NATSCA: cfg.NATSCA, Binary: cfg.Torpor, Heartbeat: cfg.Heartbeat, Path: os.Getenv("PATH"), RunAs: cfg.RunAs})
		case "vm":
			d, err = vmDriver(cfg, nc, log)
		}
		if err != nil {
			return nil, closeAll, fmt.Errorf("driver %s: %w", name, err)
		}
		drivers[name] = d
	}
	return drivers, closeAll, nil
}

// WarnRoot warns, once at start, that the process driver's workloads run
// as root: they can read and do whatever the service can.
func WarnRoot(log zerolog.Logger, runAs string) {
	if runAs == "" && os.Geteuid() == 0 {
		log.Warn().Msg("running as root without --run-as: the process driver's workloads run as root and can read the service's data, its tokens and NATS credentials (see the README, Security)")
	}
}

// invalid is err, a refusal of the config Start or RunDriver was given, as
// INVALID_ARGUMENT (CONTRACT §7: bad input gets a contract code); an error
// that carries a code already keeps it.
func invalid(err error) error {
	var ce *events.Error
	if err == nil || errors.As(err, &ce) {
		return err
	}
	return events.Errorf(events.CodeInvalidArgument, "%v", err)
}
