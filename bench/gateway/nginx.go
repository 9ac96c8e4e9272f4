package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	"github.com/fcd-authz/fcd/bench/internal/loadgen"
	"github.com/fcd-authz/fcd/internal/gatewayconf"
)

// plainNginx is design B's nginx.conf: examples/gateways/nginx.conf with
// fcd taken out and nothing else changed. Same global settings, access log,
// temporary paths, body limit, client authentication (auth_basic against
// the same bcrypt user file: a gateway authenticates its clients with or
// without fcd; design B0, without users, leaves it out too), upstream
// (keepalive 16) and proxy settings (HTTP/1.1 keep-alive, buffering off,
// Host and X-Forwarded-* headers). What differs: no auth_request (no
// subrequest to authzd, no /_fcd_forward_auth location, no fcd_authzd
// upstream), no auth_request_set, no Fcd-Caller, Fcd-Dispatch-Token or
// Fcd-Target request headers, no 401/403 problem locations, and proxy_pass
// names the default pool's upstream directly instead of through the
// $fcd_target map.
const plainNginx = `pid nginx.pid;
error_log error.log notice;

events {
    worker_connections 1024;
}

http {
    access_log access.log;

    client_body_temp_path client_body_temp;
    proxy_temp_path proxy_temp;
    fastcgi_temp_path fastcgi_temp;
    uwsgi_temp_path uwsgi_temp;
    scgi_temp_path scgi_temp;

    client_max_body_size 8m;

{{- with .DefaultPool}}
    upstream fcd_pool_{{.Name}} {
        server {{.HostPort}};
        keepalive 16;
    }
{{- end}}

    server {
        listen {{.Listen.HostPort}};

        location / {
{{- if .Users}}
            auth_basic "gateway";
            auth_basic_user_file fcd-users;
{{- end}}

            proxy_pass http://fcd_pool_{{.DefaultPool.Name}};

            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;

            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
        }
    }
}
`

// nginxWorkers is the worker count of both nginx processes, as
// internal/gatewaytest runs them.
const nginxWorkers = 2

// nginx is one running nginx process.
type nginx struct {
	url, dir string
	cmd      *exec.Cmd
	out      bytes.Buffer // guarded by mu until the process ended
	mu       sync.Mutex
	done     chan struct{}
	waitErr  error
}

func nginxBinary() (string, error) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", errors.New("nginx not found on PATH or at /usr/sbin/nginx (apt-get install nginx)")
}

func nginxVersion() string {
	bin, err := nginxBinary()
	if err != nil {
		return "nginx not found"
	}
	out, _ := exec.Command(bin, "-v").CombinedOutput()
	return strings.TrimSpace(strings.TrimPrefix(string(out), "nginx version: "))
}

// renderFCD renders examples/gateways/nginx.conf (design A), as
// internal/gatewaytest does.
func renderFCD(d gatewayconf.Data) ([]byte, error) { return gatewayconf.Render(gatewayconf.Nginx, d) }

// renderPlain renders plainNginx (designs B and, without users, B0).
func renderPlain(d gatewayconf.Data) ([]byte, error) {
	tmpl, err := template.New("plain").Option("missingkey=error").Parse(plainNginx)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	err = tmpl.Execute(&b, d)
	return b.Bytes(), err
}

// startNginx renders a configuration for a free loopback port into a new
// directory under parent and runs nginx on it the way internal/gatewaytest
// does: -p prefix, -e error log, daemon off, its own process group.
func startNginx(parent, name string, data gatewayconf.Data, render func(gatewayconf.Data) ([]byte, error)) (*nginx, error) {
	bin, err := nginxBinary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parent, "nginx-"+name+"-")
	if err != nil {
		return nil, err
	}
	addr, err := loadgen.FreeAddr()
	if err != nil {
		return nil, err
	}
	if data.Listen, err = gatewayconf.ParseEndpoint(addr); err != nil {
		return nil, err
	}
	text, err := render(data)
	if err != nil {
		return nil, fmt.Errorf("render %s nginx.conf: %w", name, err)
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, text, 0o600); err != nil {
		return nil, err
	}
	users, err := gatewayconf.Htpasswd(data.Users)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, gatewayconf.NginxUsers), users, 0o600); err != nil {
		return nil, err
	}
	global := fmt.Sprintf("daemon off; worker_processes %d;", nginxWorkers)
	if os.Geteuid() == 0 {
		// As root nginx runs workers as nobody, who cannot enter the
		// 0700 temporary directory (see internal/gatewaytest).
		global += " user root;"
	}
	n := &nginx{url: "http://" + addr, dir: dir, done: make(chan struct{})}
	n.cmd = exec.Command(bin, "-p", dir+string(filepath.Separator), "-c", conf, "-e", filepath.Join(dir, "error.log"), "-g", global)
	n.cmd.Dir = dir
	n.cmd.Stdout, n.cmd.Stderr = (*lockedWriter)(n), (*lockedWriter)(n)
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	n.cmd.WaitDelay = 5 * time.Second
	if err := n.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	go func() {
		n.waitErr = n.cmd.Wait()
		close(n.done)
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-n.done:
			return nil, fmt.Errorf("nginx (%s) exited at start: %v\n%s", name, n.waitErr, n.logs())
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return n, nil
		}
		if time.Now().After(deadline) {
			n.stop()
			return nil, fmt.Errorf("nginx (%s) not accepting connections on %s after 15s\n%s", name, addr, n.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type lockedWriter nginx

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.Write(p)
}

// alive returns an error if nginx has exited.
func (n *nginx) alive() error {
	select {
	case <-n.done:
		return fmt.Errorf("nginx exited during the run: %v\n%s", n.waitErr, n.logs())
	default:
		return nil
	}
}

func (n *nginx) logs() string {
	n.mu.Lock()
	out := n.out.String()
	n.mu.Unlock()
	data, _ := os.ReadFile(filepath.Join(n.dir, "error.log"))
	return "--- nginx output\n" + out + "--- nginx error.log\n" + string(data)
}

// stop is nginx's fast shutdown (SIGTERM), then SIGKILL to its process
// group after 3s.
func (n *nginx) stop() {
	select {
	case <-n.done:
		return
	default:
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(3 * time.Second):
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.done
	}
}
