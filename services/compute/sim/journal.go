package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// The journal's record kinds. The effects are the operations a saga may
// repeat after a crash: each is recorded once per (sandbox, generation,
// operation) however often it is called, which is what Effects counts.
const (
	opStart    = "start"
	opStop     = "stop"
	opSuspend  = "suspend"
	opResume   = "resume"
	opDiscard  = "discard"
	opDelete   = "delete"
	opAttempt  = "attempt"  // a restore attempted (fail_once counts them)
	opAttached = "attached" // the attach of a generation was taken
	opExited   = "exited"   // the workload exited on its own
)

// journalPath is the journal's file in the data directory data.
func journalPath(data string) string { return filepath.Join(data, "sim", "journal") }

// record is one line of the journal.
type record struct {
	Sandbox string            `json:"sandbox"`
	Gen     int64             `json:"gen,omitempty"`
	Op      string            `json:"op"`
	Ref     string            `json:"ref,omitempty"`
	Cred    string            `json:"cred,omitempty"`
	Code    *int              `json:"code,omitempty"`
	Failed  bool              `json:"failed,omitempty"`
	Opts    map[string]string `json:"opts,omitempty"`
}

// journal appends records to its file, one write per record, before the
// call that made it answers: a process killed after the answer has the
// record, a process killed before it may have it or not, and a call repeated
// after the restart finds it and does not repeat the effect. It survives a
// process crash, not a power loss (it is never synced: this is a
// simulator).
type journal struct {
	f *os.File
}

// openJournal opens (or creates) the journal under data and returns the
// records it holds. A last line cut short by a kill is dropped.
func openJournal(data string) (*journal, []record, error) {
	path := journalPath(data)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, nil, fmt.Errorf("sim journal: %w", err)
	}
	recs, size, err := readJournal(path)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, nil, fmt.Errorf("sim journal: %w", err)
	}
	// Cut a torn last line, so that the next record starts on a line of its own.
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sim journal: %w", err)
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sim journal: %w", err)
	}
	return &journal{f: f}, recs, nil
}

// readJournal reads the whole records of the journal at path and the size
// of the part they take.
func readJournal(path string) ([]record, int64, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("sim journal: %w", err)
	}
	var recs []record
	var size int64
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break // torn by a kill mid-write
		}
		var rec record
		if err := json.Unmarshal(data[:i], &rec); err != nil {
			return nil, 0, fmt.Errorf("sim journal %s at byte %d: %w", path, size, err)
		}
		recs = append(recs, rec)
		size += int64(i + 1)
		data = data[i+1:]
	}
	return recs, size, nil
}

func (j *journal) write(rec record) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("sim journal: %w", err)
	}
	if _, err := j.f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("sim journal: %w", err)
	}
	return nil
}

func (j *journal) close() error { return j.f.Close() }

// Effect is one effect of the sim's, as its journal records it.
type Effect struct {
	Sandbox    string
	Generation int64
	Op         string
}

// Effects reads the journal under data (a Config.Data) and counts its
// effects: what a test checks "no effect happened twice" against, across
// kills of the service. A discard's generation is the one its reference
// retained.
func Effects(data string) (map[Effect]int, error) {
	recs, _, err := readJournal(journalPath(data))
	if err != nil {
		return nil, err
	}
	out := map[Effect]int{}
	for _, r := range recs {
		switch r.Op {
		case opStart, opStop, opSuspend, opResume, opDiscard, opDelete:
			out[Effect{Sandbox: r.Sandbox, Generation: r.Gen, Op: r.Op}]++
		}
	}
	return out, nil
}

// Adopt records in the journal under data (with no sim running on it) that
// the sandboxes of a log written by hand, not through the sim, run at the
// given generations with their supervisors attached: a bench that imports
// settled histories straight into the log tells the workload side this way.
func Adopt(data string, running map[string]int64) error {
	j, _, err := openJournal(data)
	if err != nil {
		return err
	}
	for id, gen := range running {
		if err := j.write(record{Sandbox: id, Gen: gen, Op: opStart}); err != nil {
			j.close()
			return err
		}
		if err := j.write(record{Sandbox: id, Gen: gen, Op: opAttached}); err != nil {
			j.close()
			return err
		}
	}
	return j.close()
}
