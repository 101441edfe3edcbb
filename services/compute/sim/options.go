package sim

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/torpor/torpor/services/compute"
)

// The option keys of CONTRACT §8, and the values of suspend and resume.
const (
	OptLatency           = "latency"
	OptSuspend           = "suspend"
	OptResume            = "resume"
	OptExitDuringSuspend = "exit_during_suspend"
	OptExitAfter         = "exit_after"
	OptExitCode          = "exit_code"
	OptAnswerDelay       = "answer_delay"
	OptAttach            = "attach"
	OptObserve           = "observe"
	OptPorts             = "ports"

	// ObserveTruth and ObserveUnknown are the observe option's values:
	// Observe says what is true, or that it cannot tell.
	ObserveTruth   = "truth"
	ObserveUnknown = "unknown"

	// AttachNever is the attach option's value for a supervisor that never
	// attaches.
	AttachNever = "never"

	SuspendOK            = "ok"
	SuspendReject        = "reject"
	SuspendHang          = "hang"
	SuspendUnimplemented = "unimplemented"

	ResumeOK               = "ok"
	ResumeFail             = "fail"
	ResumeFailOnce         = "fail_once"
	ResumeFailAfterConsume = "fail_after_consume"
	ResumeHang             = "hang"
)

var (
	suspendModes = []string{SuspendOK, SuspendReject, SuspendHang, SuspendUnimplemented}
	resumeModes  = []string{ResumeOK, ResumeFail, ResumeFailOnce, ResumeFailAfterConsume, ResumeHang}
	observeModes = []string{ObserveTruth, ObserveUnknown}
	knownKeys    = []string{OptAnswerDelay, OptAttach, OptExitAfter, OptExitCode, OptExitDuringSuspend, OptLatency, OptObserve, OptPorts, OptResume, OptSuspend}
)

// options are the parsed driver_options of one sandbox.
type options struct {
	latency time.Duration
	suspend string
	resume  string
	// exitDuringSuspend is the exit code reported while a suspend is in
	// flight; nil means the workload does not exit.
	exitDuringSuspend *int
	// exitAfter > 0 makes the workload exit this long after it attached.
	exitAfter time.Duration
	exitCode  int
	// answerDelay is how long a call answers after its effect is done.
	answerDelay time.Duration
	// attach is how long after its workload starts (or is restored) a
	// generation's supervisor attaches; attachNever: it never does.
	attach      time.Duration
	attachNever bool
	// observe is ObserveTruth or ObserveUnknown.
	observe string
	// ports maps a port of the simulated workload to a real address a
	// connection to it reaches (for forwards).
	ports map[int]string
}

// ValidateOptions reports the first problem of opts as a sim sandbox's
// driver_options: an unknown key or a value the sim does not understand. The
// gateway calls it on create and answers INVALID_ARGUMENT with its message.
func ValidateOptions(opts map[string]string) error {
	_, err := parse(opts)
	return err
}

func parse(opts map[string]string) (options, error) {
	o := options{suspend: SuspendOK, resume: ResumeOK, observe: ObserveTruth}
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the same input always names the same problem
	for _, k := range keys {
		v := opts[k]
		var err error
		switch k {
		case OptLatency:
			o.latency, err = duration(v)
		case OptSuspend:
			o.suspend, err = oneOf(v, suspendModes)
		case OptResume:
			o.resume, err = oneOf(v, resumeModes)
		case OptExitDuringSuspend:
			var code int
			code, err = exitCode(v)
			o.exitDuringSuspend = &code
		case OptExitAfter:
			o.exitAfter, err = duration(v)
		case OptExitCode:
			o.exitCode, err = exitCode(v)
		case OptAnswerDelay:
			o.answerDelay, err = duration(v)
		case OptObserve:
			o.observe, err = oneOf(v, observeModes)
		case OptPorts:
			o.ports, err = portMap(v)
		case OptAttach:
			if v == AttachNever {
				o.attachNever = true
			} else {
				o.attach, err = duration(v)
			}
		default:
			err = fmt.Errorf("unknown option (known: %s)", strings.Join(knownKeys, ", "))
		}
		if err != nil {
			return options{}, fmt.Errorf("sim option %q: %w", k, err)
		}
	}
	return o, nil
}

// portMap parses "8000=127.0.0.1:43211,8080=host:port".
func portMap(v string) (map[int]string, error) {
	m := map[int]string{}
	for _, pair := range strings.Split(v, ",") {
		p, addr, ok := strings.Cut(pair, "=")
		n, err := strconv.Atoi(p)
		if !ok || err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%q is not PORT=HOST:PORT", pair)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("%q: %v", pair, err)
		}
		m[n] = addr
	}
	return m, nil
}

func duration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration like 250ms or 2s", v)
	}
	if d < 0 {
		return 0, fmt.Errorf("duration %s is negative", d)
	}
	return d, nil
}

func oneOf(v string, allowed []string) (string, error) {
	for _, a := range allowed {
		if v == a {
			return v, nil
		}
	}
	return "", fmt.Errorf("%q is not one of %s", v, strings.Join(allowed, ", "))
}

func exitCode(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errors.New("exit code " + strconv.Quote(v) + " is not an integer")
	}
	if n < 0 || n > 255 {
		return 0, fmt.Errorf("exit code %d is outside 0..255", n)
	}
	return n, nil
}

// ValidateSpec lets the registry check a create (compute.SpecValidator): its
// options; a sim sandbox runs no command, so any is taken.
func (d *Driver) ValidateSpec(spec compute.Spec) error { return ValidateOptions(spec.Options) }

var _ compute.SpecValidator = (*Driver)(nil)
