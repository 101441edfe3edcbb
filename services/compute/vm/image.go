package vm

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/cavaliergopher/cpio"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/supervisor"
)

// The guest's init speaks to its supervisor on the second serial port
// (ttyS1, QEMU's stdout), a line each; the workload's output goes to the
// first (ttyS0, the console log). The workload runs as the guest's root and
// could write on ttyS1 too: it can lie about its own exit, nothing more.
const (
	lineReady      = "torpor:ready"
	linePrefixExit = "torpor:exit "
)

// initScript is the guest's /init: mount what a busybox userland needs,
// load the network modules the image carries and bring up eth0 (QEMU's
// user-mode network: a static address, no DHCP client to wait for), say
// ready, run the workload (/torpor/run, made per sandbox), say its exit
// code, and end the VM (reboot=t with -no-reboot: QEMU exits).
var initScript = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /root /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs tmp /tmp
hostname torpor
stty -F /dev/ttyS0 -onlcr 2>/dev/null
stty -F /dev/ttyS1 -onlcr 2>/dev/null
ip link set lo up
for m in ` + strings.Join(netModules, " ") + `; do
	[ -f /lib/modules/$m.ko ] && insmod /lib/modules/$m.ko
done
if ip link set eth0 up 2>/dev/null; then
	ip addr add ` + guestAddr + `/24 dev eth0
	ip route add default via ` + guestGateway + `
fi
echo ` + lineReady + ` >/dev/ttyS1
cd /root
/bin/sh /torpor/run </dev/null >/dev/ttyS0 2>&1
echo "` + linePrefixExit + `$?" >/dev/ttyS1
sync
reboot -f
`

// The guest's network: QEMU's user-mode network (slirp) at its default
// addressing, the guest at 10.0.2.15, the host side at 10.0.2.2. The
// address is static: QEMU's forwards into the guest go to 10.0.2.15 by
// default, and a DHCP exchange would only add time to each boot.
const (
	guestAddr    = "10.0.2.15"
	guestGateway = "10.0.2.2"
)

// netModules are the kernel modules the guest needs for its virtio-net
// device on microvm's virtio-mmio transport, each after those it depends on
// (their modinfo "depends="): Debian's cloud kernel builds virtio as
// modules only. deploy/vm-kernel puts them in modules-<version> next to the
// kernel; the driver puts them in the guest's /lib/modules and its init
// loads them with busybox's insmod (no depmod, no modprobe: the order is
// this list's).
var netModules = []string{"virtio_ring", "virtio", "virtio_mmio", "failover", "net_failover", "virtio_net"}

// modulesDir is where deploy/vm-kernel puts the network modules of kernel:
// modules-<version> next to the file it names (after symlinks), whose name
// is vmlinuz-<version>.
func modulesDir(kernel string) string {
	real, err := filepath.EvalSymlinks(kernel)
	if err != nil {
		real = kernel
	}
	return filepath.Join(filepath.Dir(real), "modules-"+strings.TrimPrefix(filepath.Base(real), "vmlinuz-"))
}

// images builds guest initramfs images and keeps them under dir, named by
// their content: the base (busybox, /init and the network modules),
// compressed once per busybox, followed by a small uncompressed archive of
// the sandbox's /torpor/run (the kernel takes concatenated archives).
type images struct {
	dir     string
	busybox string
	// modules holds netModules as NAME.ko; without them all (a kernel
	// deploy/vm-kernel did not put there) the guest has no network.
	modules string

	mu      sync.Mutex
	base    []byte
	applets map[string]bool
	net     bool // the base carries netModules
	// made is the path of each image made or found, by its run script: a
	// resume finds its sandbox's image without building and hashing the
	// archive again (a megabyte; milliseconds of a same-node resume).
	made map[string]string
}

// load reads busybox and makes the base archive, once.
func (im *images) load() error {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.base != nil {
		return nil
	}
	bb, err := os.ReadFile(im.busybox)
	if err != nil {
		return fmt.Errorf("busybox: %w", err)
	}
	out, err := exec.Command(im.busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	applets := map[string]bool{}
	for _, a := range strings.Fields(string(out)) {
		applets[a] = true
	}
	type file struct {
		name string
		mode cpio.FileMode
		data []byte
	}
	files := []file{
		{"bin", cpio.TypeDir | 0o755, nil},
		{"dev", cpio.TypeDir | 0o755, nil},
		{"bin/busybox", cpio.TypeReg | 0o755, bb},
		{"init", cpio.TypeReg | 0o755, []byte(initScript)},
	}
	mods := []file{{"lib", cpio.TypeDir | 0o755, nil}, {"lib/modules", cpio.TypeDir | 0o755, nil}}
	for _, m := range netModules {
		b, err := os.ReadFile(filepath.Join(im.modules, m+".ko"))
		if err != nil {
			mods = nil
			break
		}
		mods = append(mods, file{"lib/modules/" + m + ".ko", cpio.TypeReg | 0o644, b})
	}
	files = append(files, mods...)
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	w := cpio.NewWriter(gz)
	for _, f := range files {
		if err := writeFile(w, f.name, f.mode, f.data); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	im.base, im.applets, im.net = buf.Bytes(), applets, mods != nil
	return nil
}

func writeFile(w *cpio.Writer, name string, mode cpio.FileMode, data []byte) error {
	if err := w.WriteHeader(&cpio.Header{Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
		return err
	}
	_, err := w.Write(data)
	return err
}

// runs says whether command can run in the guest: its program is a busybox
// applet (by name, or as /bin/NAME and the like) — the guest has nothing else.
func (im *images) runs(command []string) error {
	if err := im.load(); err != nil {
		return err
	}
	if len(command) == 0 || command[0] == "" {
		return fmt.Errorf("%w: no command", compute.ErrRejected)
	}
	name := command[0]
	if strings.Contains(name, "/") {
		switch filepath.Dir(name) {
		case "/bin", "/sbin", "/usr/bin", "/usr/sbin":
			name = filepath.Base(name)
		default:
			return fmt.Errorf("%w: command %s: the guest has busybox's applets in /bin and nothing else", compute.ErrRejected, command[0])
		}
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	if !im.applets[name] {
		return fmt.Errorf("%w: command %s: not a busybox applet, and the guest has nothing else", compute.ErrRejected, command[0])
	}
	return nil
}

// image is the path of the initramfs that runs spec's command with its
// environment, made if it is not there yet.
func (im *images) image(spec compute.Spec) (string, error) {
	if err := im.load(); err != nil {
		return "", err
	}
	script := runScript(spec)
	im.mu.Lock()
	path, ok := im.made[script]
	im.mu.Unlock()
	if ok {
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	var buf bytes.Buffer
	buf.Write(im.base)
	// The kernel finds an archive that follows a compressed one only at a
	// 4-byte boundary (it skips zeros up to it).
	for buf.Len()%4 != 0 {
		buf.WriteByte(0)
	}
	w := cpio.NewWriter(&buf)
	if err := writeFile(w, "torpor", cpio.TypeDir|0o755, nil); err != nil {
		return "", err
	}
	if err := writeFile(w, "torpor/run", cpio.TypeReg|0o644, []byte(script)); err != nil {
		return "", err
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	path = filepath.Join(im.dir, hex.EncodeToString(sum[:16])+".img")
	if _, err := os.Stat(path); err == nil {
		im.remember(script, path)
		return path, nil
	}
	if err := os.MkdirAll(im.dir, 0o750); err != nil {
		return "", err
	}
	if err := supervisor.WriteFile(path, buf.Bytes()); err != nil {
		return "", err
	}
	im.remember(script, path)
	return path, nil
}

// maxMade bounds images.made (one entry per sandbox's run script).
const maxMade = 4096

// remember notes that the image of script is at path.
func (im *images) remember(script, path string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.made == nil || len(im.made) >= maxMade {
		im.made = map[string]string{} // bounded: a forgotten one is made again
	}
	im.made[script] = path
}

// runScript is the sandbox's /torpor/run: its environment exported and its
// command executed, every word quoted for sh.
func runScript(spec compute.Spec) string {
	env := map[string]string{"PATH": "/bin:/sbin:/usr/bin:/usr/sbin", "HOME": "/root", "TORPOR_SANDBOX_ID": spec.SandboxID}
	for k, v := range spec.Env {
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "export %s=%s\n", k, quote(env[k]))
	}
	b.WriteString("exec")
	for _, a := range spec.Command {
		b.WriteString(" " + quote(a))
	}
	b.WriteString("\n")
	return b.String()
}

// quote is s as one sh word.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
