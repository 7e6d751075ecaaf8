package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web"
)

// TestUsersFlags: --user and --users map keys to names; bad entries and a
// key that would name two users are refused with the place named, and the
// keys never appear in an error.
func TestUsersFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(file, []byte("# team\ncarol:key-c\n\n  dave : key-d  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string {
		if k == "PARLEY_USERS" {
			return file
		}
		return ""
	}
	c, err := parseFlags([]string{"--model", "m.gguf", "--user", "alice:key-a", "--user", "bob:key:with:colons"}, env, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := []web.UserKey{{User: "alice", Key: "key-a"}, {User: "bob", Key: "key:with:colons"}, {User: "carol", Key: "key-c"}, {User: "dave", Key: "key-d"}}
	if !reflect.DeepEqual(c.users, want) {
		t.Fatalf("users %+v, want %+v", c.users, want)
	}
	if got := serverConfig(c, parley.DefaultParams()).Users; !reflect.DeepEqual(got, want) {
		t.Fatalf("server config users %+v", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--user", "alice"}, "want NAME:KEY"},
		{[]string{"--user", "alice:"}, "want NAME:KEY"},
		{[]string{"--user", "a b:secret-1"}, "a user name is"},
		{[]string{"--user", "a:secret-1", "--user", "b:secret-1"}, "same key"},
		{[]string{"--api-key", "secret-1", "--user", "b:secret-1"}, "same key as --api-key"},
		{[]string{"--users", filepath.Join(t.TempDir(), "missing")}, "--users"},
	} {
		_, err := parseFlags(append([]string{"--model", "m.gguf"}, tc.args...), func(string) string { return "" }, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret-1") {
			t.Errorf("%v: %v, want an error with %q and no key", tc.args, err, tc.want)
		}
	}
}
