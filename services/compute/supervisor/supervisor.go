// Package supervisor is what every driver's supervisor (`torpor supervise`,
// beside a process group or a QEMU) shares: how it sends its reports to the
// gateways, and how it takes its credential.
package supervisor

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/services/compute"
)

// CredentialEnv is the environment variable through which a supervisor
// gets its credential: the environment, unlike the arguments, is not for
// every user of the machine to read. The workload does not inherit it.
const CredentialEnv = "TORPOR_SUPERVISOR_CREDENTIAL"

// BusCredsEnv is the environment variable through which a supervisor gets
// its NATS credentials file's text (compute.Start.BusCreds), as
// CredentialEnv: the workload does not inherit it.
const BusCredsEnv = "TORPOR_SUPERVISOR_NATS_CREDS"

// How often a supervisor retries a report nobody answered, and how long it
// waits for one answer.
const (
	BackoffMin     = 50 * time.Millisecond
	BackoffMax     = 2 * time.Second
	RequestTimeout = 2 * time.Second
)

// Answer is what became of a report sent once.
type Answer int

const (
	// Again: no gateway answered, or one answered with an error that
	// sending the report again may overcome (UNAVAILABLE, ABORTED,
	// INTERNAL, …): the report is to be sent again.
	Again Answer = iota
	// Taken: a gateway took the report.
	Taken
	// Refused: a gateway refused the report for good (Final).
	Refused
)

func (a Answer) String() string {
	switch a {
	case Taken:
		return "taken"
	case Refused:
		return "refused"
	}
	return "again"
}

// Final says whether a gateway's refusal of a report, by its code, is for
// good: the report does not fit the sandbox as the log stands at its head
// (FAILED_PRECONDITION: the gateway judges a refusal again on the head
// before it answers so), its credential is bad (UNAUTHENTICATED), it is
// malformed (INVALID_ARGUMENT), or its sandbox is not in the log
// (NOT_FOUND). Any other answer is a gateway or a log that failed this
// time (one append that failed, a conflict retried out, a timeout), and
// a report dropped on it would be lost for good: an attach, or an exit
// that nothing else records.
func Final(c events.Code) bool {
	switch c {
	case events.CodeFailedPrecondition, events.CodeUnauthenticated, events.CodeInvalidArgument, events.CodeNotFound:
		return true
	}
	return false
}

// Sender sends one supervisor's reports on compute.ReportSubject. The zero
// value is not usable: set NC and Log.
type Sender struct {
	NC  *nats.Conn
	Log zerolog.Logger
	// unanswered: the last report got no answer, or not a final one;
	// beat is the answer to the last heartbeat.
	unanswered bool
	beat       string
	// code is the code of the last answer ("" for none, or taken).
	code events.Code
}

// Send asks a gateway to take r and says what became of it: taken,
// refused for good, or to be sent again (no answer, or an answer that is
// not final). What it logs is the changes: the first report not answered
// for good (the service is down, say) and the first answered after,
// every refusal of an attach or an exit, and a heartbeat's answer when it
// differs from the last heartbeat's, so a supervisor waiting out a long
// downtime, or heartbeating where heartbeats are refused, does not fill
// its log.
func (s *Sender) Send(r compute.Report) Answer {
	log := s.Log.With().Int64("generation", r.Generation).Str("kind", r.Kind).Logger()
	s.code = ""
	data, err := json.Marshal(r)
	if err != nil {
		log.Error().Err(err).Msg("report")
		return Refused
	}
	msg, err := s.NC.Request(compute.ReportSubject(r.SandboxID), data, RequestTimeout)
	if err != nil {
		if !s.unanswered {
			log.Warn().Err(err).Msg("report unanswered; reports are asked again until a gateway answers")
		}
		s.unanswered = true
		return Again
	}
	var body events.ErrorBody
	if json.Unmarshal(msg.Data, &body) == nil && body.Error != nil {
		s.code = body.Error.Code
		if !Final(s.code) {
			if !s.unanswered {
				log.Warn().Str("code", string(s.code)).Str("message", body.Error.Message).
					Msg("report not taken for now; reports are asked again until a gateway takes or refuses them")
			}
			s.unanswered = true
			return Again
		}
	}
	if s.unanswered {
		log.Info().Msg("reports answered again")
		s.unanswered = false
	}
	answer, a := "taken", Taken
	if body.Error != nil {
		answer, a = string(body.Error.Code)+": "+body.Error.Message, Refused
	}
	if r.Kind == compute.ReportHeartbeat {
		if answer == s.beat {
			return a
		}
		s.beat = answer
	}
	if body.Error != nil {
		log.Warn().Str("code", string(body.Error.Code)).Str("message", body.Error.Message).Msg("report refused")
	} else {
		log.Info().Msg("report taken")
	}
	return a
}

// Reports sends one supervisor's reports in order. The attach and exit
// reports are queued, and each is sent until a gateway takes it or refuses
// it for good (Final), again after a pause that grows from BackoffMin to
// BackoffMax while it is not: a report is never dropped on a failure of
// the moment, and none overtakes the one before. Heartbeats go between
// them, when none is queued. The loop that owns it calls Flush when C
// fires, and Beat on its heartbeat tick; it is not safe for concurrent use.
type Reports struct {
	sender  *Sender
	queue   []compute.Report
	backoff time.Duration
	timer   *time.Timer
	// noAttach is the generation whose attach was refused for good since
	// its heartbeat was last taken (0: none): a supervisor whose beats
	// are refused attaches again once, not at every beat.
	noAttach int64
}

// NewReports returns an empty queue sending through s.
func NewReports(s *Sender) *Reports {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &Reports{sender: s, backoff: BackoffMin, timer: t}
}

// C fires when the first queued report is due.
func (q *Reports) C() <-chan time.Time { return q.timer.C }

// Stop stops the timer.
func (q *Reports) Stop() { q.timer.Stop() }

// Empty says whether no report is waiting for its answer.
func (q *Reports) Empty() bool { return len(q.queue) == 0 }

// Add queues r after the others; it is due at once.
func (q *Reports) Add(r compute.Report) {
	q.queue = append(q.queue, r)
	q.due(0)
}

// Replace makes r the only queued report (a new generation's attach: the
// older generation's reports not answered yet are moot), due at once.
func (q *Reports) Replace(r compute.Report) {
	q.queue = append(q.queue[:0], r)
	q.due(0)
}

// due arms the timer to fire after d, dropping a tick it left unread.
func (q *Reports) due(d time.Duration) {
	if d == 0 {
		q.backoff = BackoffMin
	}
	q.timer.Stop()
	select {
	case <-q.timer.C:
	default:
	}
	q.timer.Reset(d)
}

// Flush sends the queued reports in order until one is neither taken nor
// refused for good; that one is due again after a pause.
func (q *Reports) Flush() {
	for len(q.queue) > 0 {
		r := q.queue[0]
		a := q.sender.Send(r)
		if a == Again {
			q.due(q.backoff)
			q.backoff = min(2*q.backoff, BackoffMax)
			return
		}
		if r.Kind == compute.ReportAttached {
			q.noAttach = 0
			if a == Refused {
				q.noAttach = r.Generation
			}
		}
		q.queue = q.queue[1:]
		q.backoff = BackoffMin
	}
}

// Beat sends heartbeat r if no report is queued. A heartbeat refused as
// not the attached generation's (FAILED_PRECONDITION) while the
// supervisor's generation is still current is a supervisor recorded
// detached after a silence (a network cut longer than the gateway's
// heartbeat limit): it queues r's attach again, which the gateway takes
// for the current generation (and fences for any other; then the
// supervisor does not try again until a beat of it is taken).
func (q *Reports) Beat(r compute.Report) {
	if len(q.queue) > 0 {
		return
	}
	switch q.sender.Send(r) {
	case Taken:
		q.noAttach = 0
	case Refused:
		if q.sender.code == events.CodeFailedPrecondition && q.noAttach != r.Generation {
			attach := r
			attach.Kind, attach.ExitCode = compute.ReportAttached, 0
			q.Add(attach)
		}
	}
}

// Connect connects a supervisor of sandbox to url as the user of creds (a
// NATS credentials file's text; empty: none), retrying for ever: a service
// down now is asked again.
func Connect(url, sandbox, creds, ca string) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name("torpor supervise " + sandbox),
		nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.ReconnectWait(250 * time.Millisecond)}
	if ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	if creds != "" {
		u, err := busauth.ParseCreds([]byte(creds), busauth.Grant{Role: busauth.Supervisor, Sandbox: sandbox})
		if err != nil {
			return nil, err
		}
		opts = append(opts, u.Options()...)
	}
	return nats.Connect(url, opts...)
}
