package vm

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/services/compute"
)

// SnapshotBucket is the object store bucket snapshots move between nodes
// through (CONTRACT §4).
const SnapshotBucket = "torpor_snapshots"

// A movable snapshot is one object of SnapshotBucket, named
// <sandbox id>/<snapshot>, holding, gzip-compressed, a stream of: a JSON
// header line (objectHeader), the device state, then the RAM file's
// non-zero blocks, each as its offset (8 bytes, big-endian), its length (4
// bytes) and its bytes, ended by the offset endBlocks. Its reference is
// "vmobj:<name>:<digest>", the digest the SHA-256 of the uncompressed
// stream: it names the snapshot and carries no secret.
type objectHeader struct {
	Version   int    `json:"version"`
	State     string `json:"state"`
	StateSize int64  `json:"state_size"`
	RAMSize   int64  `json:"ram_size"`
}

const (
	objectPrefix = "vmobj:"
	endBlocks    = ^uint64(0)
	blockSize    = 4 << 10
	// objectChunk is the object store's chunk size (its default).
	objectChunk = 128 << 10
)

// objectRef is a parsed movable reference.
type objectRef struct{ name, digest string }

func parseObjectRef(ref string) (objectRef, error) {
	rest, ok := strings.CutPrefix(ref, objectPrefix)
	if !ok {
		return objectRef{}, errors.New("not an object reference")
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 || len(rest)-i-1 != 64 {
		return objectRef{}, fmt.Errorf("malformed object reference %q", ref)
	}
	return objectRef{name: rest[:i], digest: rest[i+1:]}, nil
}

func (o objectRef) String() string { return objectPrefix + o.name + ":" + o.digest }

// Export puts the snapshot behind ref into the object store, compressed
// (an idle guest's RAM is mostly zeros, and only its non-zero blocks are
// written), and returns the reference that names the object and its
// digest. An export ahead of it under way (ahead.go) is waited for, not
// begun again. The snapshot stays held on this node until it is restored
// elsewhere and discarded here. A repeat returns the same reference.
func (d *Driver) Export(ctx context.Context, spec compute.Spec, ref string) (string, error) {
	id := spec.SandboxID
	if d.cfg.Snapshots == nil {
		return "", fmt.Errorf("export %s: %w: this node has no object store for snapshots", id, compute.ErrUnimplemented)
	}
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return "", fmt.Errorf("export %s: %w", id, err)
	}
	if err := d.settleExport(ctx, id, dir, st); err != nil {
		return "", fmt.Errorf("export %s: %w", id, err)
	}
	if st == nil || st.Suspension == nil || st.Suspension.Ref != ref || !st.Suspension.Held {
		return "", fmt.Errorf("export %s: %w: %q", id, compute.ErrUnknownRef, ref)
	}
	s := st.Suspension
	if !s.Moving {
		s.Moving = true
		if err := save(dir, st); err != nil {
			return "", fmt.Errorf("export %s: %w", id, err)
		}
	}
	if s.Exported != "" {
		if o, err := parseObjectRef(s.Exported); err == nil {
			if _, err := d.cfg.Snapshots.GetInfo(ctx, o.name); err == nil {
				return s.Exported, nil
			}
		}
	}
	e := d.startExport(id, dir, s, 0)
	select {
	case <-e.done:
	case <-ctx.Done():
		return "", fmt.Errorf("export %s: %w", id, ctx.Err())
	}
	if e.err != nil {
		_ = d.settleExport(ctx, id, dir, st)
		return "", fmt.Errorf("export %s: %w", id, e.err)
	}
	if err := d.settleExport(ctx, id, dir, st); err != nil {
		return "", fmt.Errorf("export %s: %w", id, err)
	}
	return e.via, nil
}

// writeSnapshot writes the movable stream of s (in dir) to w, compressed,
// with its uncompressed bytes into h; opened, if set, is called once the
// snapshot's files are open, before anything is written.
func writeSnapshot(w io.Writer, h hash.Hash, dir string, s *suspension, opened func()) error {
	// The object store makes a chunk of each Read of what it puts: the
	// compressor's small writes are gathered into whole chunks first, or a
	// snapshot is thousands of tiny messages (and the store's publisher
	// stalls on their acks).
	chunks := bufio.NewWriterSize(w, objectChunk)
	gz, _ := gzip.NewWriterLevel(chunks, gzip.BestSpeed)
	out := bufio.NewWriterSize(io.MultiWriter(gz, h), 1<<20)
	state, err := os.ReadFile(filepath.Join(dir, s.State))
	if err != nil {
		return err
	}
	ram, err := os.Open(filepath.Join(dir, s.RAM))
	if err != nil {
		return err
	}
	defer ram.Close()
	fi, err := ram.Stat()
	if err != nil {
		return err
	}
	if opened != nil {
		opened()
	}
	hdr, _ := json.Marshal(objectHeader{Version: 1, State: s.State, StateSize: int64(len(state)), RAMSize: fi.Size()})
	out.Write(append(hdr, '\n'))
	out.Write(state)
	buf := make([]byte, blockSize)
	var frame [12]byte
	for off := int64(0); off < fi.Size(); off += blockSize {
		n, err := ram.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		block := buf[:n]
		if allZero(block) {
			continue
		}
		binary.BigEndian.PutUint64(frame[:8], uint64(off))
		binary.BigEndian.PutUint32(frame[8:], uint32(n))
		out.Write(frame[:])
		out.Write(block)
	}
	binary.BigEndian.PutUint64(frame[:8], endBlocks)
	out.Write(frame[:8])
	if err := out.Flush(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return chunks.Flush()
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	return bytes.Count(b, []byte{0}) == len(b)
}

// fetch lays out the snapshot of object o in dir for generation gen: the
// device state and a sparse RAM file, both checked against o's digest
// before anything is restored. An object that is not there is
// ErrUnknownRef (consumed, discarded, or never made).
func (d *Driver) fetch(ctx context.Context, dir string, st *state, req compute.Resume, o objectRef) (*suspension, error) {
	s, rest, err := d.fetchStreamed(ctx, dir, req, o)
	if err != nil {
		return nil, err
	}
	if err := rest(); err != nil {
		return nil, err
	}
	return s, nil
}

// readSnapshot reads a movable stream from r into dir (s.State, s.RAM) and
// checks its digest; laidOut, if set, is called once the RAM file has its
// size and s.State its name, before any of the memory is written.
func readSnapshot(r io.Reader, dir string, s *suspension, digest string, laidOut func()) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	h := sha256.New()
	in := bufio.NewReaderSize(io.TeeReader(gz, h), 1<<20)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("header: %w", err)
	}
	var hdr objectHeader
	if err := json.Unmarshal(line, &hdr); err != nil || hdr.Version != 1 || strings.ContainsAny(hdr.State, `/\`) || hdr.State == "" {
		return fmt.Errorf("header %q: not a snapshot this driver knows", line)
	}
	s.State = hdr.State
	state := make([]byte, hdr.StateSize)
	if _, err := io.ReadFull(in, state); err != nil {
		return fmt.Errorf("device state: %w", err)
	}
	ram, err := os.OpenFile(filepath.Join(dir, s.RAM), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer ram.Close()
	if err := ram.Truncate(hdr.RAMSize); err != nil {
		return err
	}
	if laidOut != nil {
		laidOut()
	}
	buf := make([]byte, blockSize)
	var frame [12]byte
	for {
		if _, err := io.ReadFull(in, frame[:8]); err != nil {
			return fmt.Errorf("memory: %w", err)
		}
		off := binary.BigEndian.Uint64(frame[:8])
		if off == endBlocks {
			break
		}
		if _, err := io.ReadFull(in, frame[8:]); err != nil {
			return fmt.Errorf("memory: %w", err)
		}
		n := binary.BigEndian.Uint32(frame[8:])
		if n > blockSize || int64(off)+int64(n) > hdr.RAMSize {
			return fmt.Errorf("memory block at %d of %d bytes: out of bounds", off, n)
		}
		if _, err := io.ReadFull(in, buf[:n]); err != nil {
			return fmt.Errorf("memory: %w", err)
		}
		if _, err := ram.WriteAt(buf[:n], int64(off)); err != nil {
			return err
		}
	}
	if _, err := io.Copy(io.Discard, in); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("digest %s, want %s", got, digest)
	}
	if err := os.WriteFile(filepath.Join(dir, s.State), state, 0o600); err != nil {
		return err
	}
	s.Size = hdr.StateSize
	// The RAM file is not synced: the guest's memory is no more durable
	// than on a resume on the same node (the object stays in the store
	// until the guest runs here).
	return nil
}

// deleteObjects deletes every snapshot object of sandbox id.
func (d *Driver) deleteObjects(ctx context.Context, id string) error {
	if d.cfg.Snapshots == nil {
		return nil
	}
	infos, err := d.cfg.Snapshots.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, info := range infos {
		if strings.HasPrefix(info.Name, id+"/") {
			if err := d.cfg.Snapshots.Delete(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
				return err
			}
		}
	}
	return nil
}
