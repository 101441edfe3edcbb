package process

import (
	"bytes"
	"io"
	"os"
)

// maxLogRead bounds how much of an output file Logs reads back, whatever
// the lines' length.
const maxLogRead = 4 << 20

// lastLines returns the last n lines of the file at path (all of it for n
// < 1), at most maxLogRead bytes of them, each ending in a newline; nothing
// if the file does not exist.
func lastLines(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if isNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	// Read back from the end, a block at a time, until the part read holds
	// n line ends before its last line's.
	const block = 64 << 10
	var buf []byte
	ends := 0 // line ends in buf, but for the file's last byte's
	off := size
	for off > 0 && len(buf) < maxLogRead {
		k := min(block, off)
		off -= k
		chunk := make([]byte, k, k+int64(len(buf)))
		if _, err := f.ReadAt(chunk, off); err != nil {
			return nil, err
		}
		if buf == nil {
			ends -= bytes.Count(chunk[len(chunk)-1:], []byte("\n"))
		}
		ends += bytes.Count(chunk, []byte("\n"))
		buf = append(chunk, buf...)
		if n > 0 && ends >= n {
			break
		}
	}
	if len(buf) == 0 {
		return nil, nil
	}
	if buf[len(buf)-1] != '\n' {
		buf = append(buf, '\n')
	}
	if n > 0 {
		body := buf[:len(buf)-1]
		for i := len(body) - 1; i >= 0; i-- {
			if body[i] != '\n' {
				continue
			}
			if n--; n == 0 {
				return buf[i+1:], nil
			}
		}
	}
	if off > 0 {
		// Cut at a line start: the first line read may be the end of one.
		if i := bytes.IndexByte(buf, '\n'); i >= 0 && i < len(buf)-1 {
			return buf[i+1:], nil
		}
	}
	return buf, nil
}
