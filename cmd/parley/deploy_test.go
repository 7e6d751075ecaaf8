package main

// Checks what can be checked here of the deployment examples in deploy/:
// the YAML parses, nginx accepts its configuration, and every flag the
// replicas are given exists.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testbin"
)

func TestDeployExamples(t *testing.T) {
	deploy := filepath.Join("..", "..", "deploy")
	yamls := []string{filepath.Join(deploy, "compose.yaml"), filepath.Join(deploy, "k8s.yaml")}

	t.Run("yaml parses", func(t *testing.T) {
		if exec.Command("python3", "-c", "import yaml").Run() != nil {
			t.Skip("python3 with PyYAML is not installed (apt-get install python3-yaml)")
		}
		for _, f := range yamls {
			out, err := exec.Command("python3", "-c",
				"import sys, yaml; docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]; assert docs; print(len(docs))", f).CombinedOutput()
			if err != nil {
				t.Errorf("%s: %v\n%s", f, err, out)
			}
		}
	})

	t.Run("nginx -t", func(t *testing.T) {
		bin, err := exec.LookPath("nginx")
		if err != nil {
			if bin, err = exec.LookPath("/usr/sbin/nginx"); err != nil {
				t.Skip("nginx is not installed (apt-get install nginx)")
			}
		}
		conf, err := os.ReadFile(filepath.Join(deploy, "nginx.conf"))
		if err != nil {
			t.Fatal(err)
		}
		// The replicas' compose names do not resolve here, and an
		// unprivileged nginx keeps its files under its prefix.
		dir := t.TempDir()
		s := regexp.MustCompile(`parley-\d:8000`).ReplaceAllString(string(conf), "127.0.0.1:9")
		s = strings.Replace(s, "http {", "http {\n  client_body_temp_path "+dir+"/body; proxy_temp_path "+dir+
			"/proxy; fastcgi_temp_path "+dir+"/fastcgi; uwsgi_temp_path "+dir+"/uwsgi; scgi_temp_path "+dir+"/scgi;", 1)
		s = strings.Replace(s, "listen 8000;", "listen 127.0.0.1:"+strings.Split(freeAddr(t), ":")[1]+";", 1)
		path := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "-t", "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log"),
			"-g", "pid "+dir+"/nginx.pid;").CombinedOutput()
		if err != nil {
			t.Fatalf("nginx -t: %v\n%s", err, out)
		}
	})

	t.Run("replica flags exist", func(t *testing.T) {
		help, _ := exec.Command(testbin.Parley(t), "--help").CombinedOutput()
		flag := regexp.MustCompile(`^\s*-\s+--([a-z-]+)`)
		n := 0
		for _, f := range yamls {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(b), "\n") {
				m := flag.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				n++
				if !strings.Contains(string(help), "-"+m[1]+" ") && !strings.Contains(string(help), "-"+m[1]+"\n") {
					t.Errorf("%s gives --%s, which parley --help does not list", filepath.Base(f), m[1])
				}
			}
		}
		if n < 6 {
			t.Fatalf("found only %d flags in the examples", n)
		}
	})
}
