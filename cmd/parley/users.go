package main

// Named users: --user NAME:KEY (repeated) and --users FILE map API keys to
// users, whose sessions only they reach (web.Config.Users).

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/parley-chat/parley/web"
)

// maxUserName bounds a user's name: it is stored in every session record
// and keys the store's per-user index.
const maxUserName = 64

// userFlag collects --user NAME:KEY, one per use of the flag.
type userFlag []string

func (f *userFlag) String() string { return fmt.Sprintf("%d users", len(*f)) } // never the keys

func (f *userFlag) Set(v string) error {
	*f = append(*f, v)
	return nil
}

// parseUser reads one "NAME:KEY" entry; where says where it came from.
func parseUser(entry, where string) (web.UserKey, error) {
	name, key, ok := strings.Cut(entry, ":")
	name, key = strings.TrimSpace(name), strings.TrimSpace(key)
	if !ok || key == "" {
		return web.UserKey{}, fmt.Errorf("%s: want NAME:KEY", where)
	}
	if name == "" || len(name) > maxUserName || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._@-", r))
	}) >= 0 {
		return web.UserKey{}, fmt.Errorf("%s: a user name is 1 to %d letters, digits or . _ @ -", where, maxUserName)
	}
	return web.UserKey{User: name, Key: key}, nil
}

// loadUsers gathers the users of --user entries and the --users file (one
// NAME:KEY a line; blank lines and lines starting with # are skipped). A
// key given twice, or equal to --api-key, is an error: it would name two
// users.
func loadUsers(entries []string, file, apiKey string) ([]web.UserKey, error) {
	var users []web.UserKey
	for i, e := range entries {
		u, err := parseUser(e, fmt.Sprintf("--user #%d", i+1))
		if err != nil {
			return nil, err
		}
		users = append(users, u)
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--users: %w", err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			u, err := parseUser(line, fmt.Sprintf("--users %s line %d", file, n))
			if err != nil {
				return nil, err
			}
			users = append(users, u)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("--users: %w", err)
		}
	}
	seen := map[string]string{}
	if apiKey != "" {
		seen[apiKey] = "--api-key"
	}
	for _, u := range users {
		if other, dup := seen[u.Key]; dup {
			return nil, fmt.Errorf("user %s has the same key as %s: every key must name one user", u.User, other)
		}
		seen[u.Key] = "user " + u.User
	}
	return users, nil
}
