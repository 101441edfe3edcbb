package process

import (
	"errors"
	"fmt"
	"os/user"
	"strconv"
	"strings"
	"syscall"
)

// User is whom a workload runs as (Config.RunAs): its uid and gid, with no
// supplementary groups.
type User struct {
	UID, GID int
}

// String is u as --run-as takes it back: "uid:gid".
func (u User) String() string { return strconv.Itoa(u.UID) + ":" + strconv.Itoa(u.GID) }

// LookupUser resolves what --run-as names: a user name (its primary group),
// a uid (a known user's, with its primary group) or uid:gid (any numbers).
func LookupUser(s string) (User, error) {
	if s == "" {
		return User{}, errors.New("run as: no user")
	}
	if uid, gid, ok := strings.Cut(s, ":"); ok {
		u, err1 := id(uid)
		g, err2 := id(gid)
		if err := errors.Join(err1, err2); err != nil {
			return User{}, fmt.Errorf("run as %q: want a user name, a uid or uid:gid: %w", s, err)
		}
		return User{UID: u, GID: g}, nil
	}
	var (
		found *user.User
		err   error
	)
	if _, nerr := strconv.Atoi(s); nerr == nil {
		found, err = user.LookupId(s)
	} else {
		found, err = user.Lookup(s)
	}
	if err != nil {
		return User{}, fmt.Errorf("run as %q: unknown user (give a user of this host, or uid:gid): %w", s, err)
	}
	u, err1 := id(found.Uid)
	g, err2 := id(found.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return User{}, fmt.Errorf("run as %q: %w", s, err)
	}
	return User{UID: u, GID: g}, nil
}

// id is a uid or gid: a number from 0 to 2^32-2.
func id(s string) (int, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 {
		return 0, fmt.Errorf("%q is no uid or gid", s)
	}
	return int(n), nil
}

// become makes this process u: no supplementary groups, then u's gid, then
// its uid (in that order: once the uid is not root's, the rest is refused).
// The syscall package applies each to every thread of the process.
func become(u User) error {
	if err := syscall.Setgroups([]int{}); err != nil {
		return fmt.Errorf("run as %s: clear the supplementary groups: %w", u, err)
	}
	if err := syscall.Setgid(u.GID); err != nil {
		return fmt.Errorf("run as %s: setgid: %w", u, err)
	}
	if err := syscall.Setuid(u.UID); err != nil {
		return fmt.Errorf("run as %s: setuid: %w", u, err)
	}
	return nil
}
