package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/apitest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/manifest"
)

// uiCSP is the Content-Security-Policy every /ui answer carries.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// TestUIServedWithSecurityHeaders fetches the approval UI over plain HTTP:
// no credential needed, the security headers on every /ui answer, the
// redirect, the media types, 404 for anything else, and no inline script,
// inline style or HTML-parsing DOM sink in what is served.
func TestUIServedWithSecurityHeaders(t *testing.T) {
	h, _ := oasRouter(t)
	srv := httptest.NewServer(h)
	defer srv.Close()
	oasWatch(t, srv.URL, t)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for name, want := range map[string]string{
			"Content-Security-Policy": uiCSP,
			"X-Content-Type-Options":  "nosniff",
			"X-Frame-Options":         "DENY",
			"Referrer-Policy":         "no-referrer",
			"Cache-Control":           "no-store",
		} {
			if got := resp.Header.Get(name); got != want {
				t.Errorf("GET %s: %s = %q, want %q", path, name, got, want)
			}
		}
		return resp, string(body)
	}

	files := map[string]string{}
	for path, ctype := range map[string]string{
		"/ui/":        "text/html; charset=utf-8",
		"/ui/app.js":  "text/javascript; charset=utf-8",
		"/ui/app.css": "text/css; charset=utf-8",
	} {
		resp, body := get(path)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ctype || len(body) == 0 {
			t.Fatalf("GET %s: %d %q, %d bytes", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
		files[path] = body
	}
	if resp, _ := get("/ui"); resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d to %q, want 302 to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, path := range []string{"/ui/nope.js", "/ui/ui/app.js", "/ui/%2e%2e%2fopenapi.yaml", "/ui/..%2fserver.go", "/ui/index.txt"} {
		if resp, body := get(path); resp.StatusCode != http.StatusNotFound || !strings.Contains(body, api.ProblemBase+"not-found") {
			t.Errorf("GET %s: %d %s, want 404 not-found", path, resp.StatusCode, body)
		}
	}

	page := files["/ui/"]
	for _, m := range regexp.MustCompile(`(?i)<script[^>]*>`).FindAllString(page, -1) {
		if !strings.Contains(m, `src="app.js"`) {
			t.Errorf("index.html has an inline script: %s", m)
		}
	}
	for _, bad := range []string{"<style", " style=", " onclick=", " onload=", " onsubmit=", "javascript:"} {
		if strings.Contains(strings.ToLower(page), bad) {
			t.Errorf("index.html contains %q, which the CSP forbids", bad)
		}
	}
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "localStorage"} {
		if strings.Contains(files["/ui/app.js"], sink) {
			t.Errorf("app.js uses %s", sink)
		}
	}
}

// TestApproverMe checks GET /v1/approvers/me, which the UI calls at
// sign-in: an approver gets its id, any other role 403, none 401.
func TestApproverMe(t *testing.T) {
	h, secrets := oasRouter(t)
	call := func(secret api.Secret) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/v1/approvers/me", nil)
		if secret != "" {
			req.Header.Set("Authorization", "Bearer "+string(secret))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		oasCheckRecorded(t, req, rec)
		return rec
	}
	rec := call(secrets[api.RoleApprover])
	var me map[string]string
	_ = json.Unmarshal(rec.Body.Bytes(), &me)
	if rec.Code != http.StatusOK || me["id"] != "test-approver" || me["role"] != "approver" || rec.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("approver: %d %s", rec.Code, rec.Body)
	}
	if rec := call(secrets[api.RoleHost]); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "forbidden-role") {
		t.Fatalf("host: %d %s", rec.Code, rec.Body)
	}
	if rec := call(""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("no credential: %d %s", rec.Code, rec.Body)
	}
	// GET /v1/operators/me answers an operator's id, and refuses an approver.
	req := httptest.NewRequest(http.MethodGet, "/v1/operators/me", nil)
	req.Header.Set("Authorization", "Bearer "+string(secrets[api.RoleOperator]))
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	oasCheckRecorded(t, req, rec)
	me = nil
	_ = json.Unmarshal(rec.Body.Bytes(), &me)
	if rec.Code != http.StatusOK || me["id"] != "test-operator" || me["role"] != "operator" {
		t.Fatalf("operator: %d %s", rec.Code, rec.Body)
	}
	req.Header.Set("Authorization", "Bearer "+string(secrets[api.RoleApprover]))
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	oasCheckRecorded(t, req, rec)
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "forbidden-role") {
		t.Fatalf("approver at /v1/operators/me: %d %s", rec.Code, rec.Body)
	}
}

// uiWait bounds every wait on the browser or the server: generous, since
// the tests run on a slow shared machine; nothing asserts on timing.
const uiWait = 30 * time.Second

// startChromium starts one headless Debian chromium for a test and returns
// its context; each tab is a chromedp.NewContext of it.
func startChromium(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is needed for the approval UI tests (.ci/run installs Debian's chromium)")
	}
	dir, err := os.MkdirTemp("", "fcd-ui-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(dir),
	)
	browserCtx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
		_ = os.RemoveAll(dir)
	})
	// The first call starts the browser, bound to browserCtx (no timeout).
	if err := chromedp.Do(browserCtx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return browserCtx
}

// uiTab is one browser tab on the approval UI of a fixture.
type uiTab struct {
	t   *testing.T
	f   *fixture
	ctx context.Context
}

func (f *fixture) openTab(t *testing.T, browser context.Context) *uiTab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("open tab: %v", err)
	}
	return &uiTab{t: t, f: f, ctx: ctx}
}

// do runs browser steps within uiWait.
func (u *uiTab) do(steps ...chromedp.Action[chromedp.Void]) {
	u.t.Helper()
	ctx, cancel := context.WithTimeout(u.ctx, uiWait)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		u.t.Fatalf("browser: %v", err)
	}
}

// eval evaluates a JavaScript expression in the page (DevTools evaluation
// is not subject to the page's CSP).
func uiEval[T any](u *uiTab, expr string) T {
	u.t.Helper()
	ctx, cancel := context.WithTimeout(u.ctx, uiWait)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		u.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor waits until a JavaScript expression is true in the page.
// chromedp.Poll would build the predicate with new Function, which the
// page's CSP refuses, so this polls from Go.
func (u *uiTab) waitFor(expr string) {
	u.t.Helper()
	testutil.EventuallyState(u.t, uiWait, expr, func() bool { return uiEval[bool](u, "Boolean("+expr+")") },
		func() string { return "page text:\n" + uiEval[string](u, "document.body.innerText") })
}

// text is the textContent of the first element matching a CSS selector
// ("" when none matches).
func (u *uiTab) text(css string) string {
	u.t.Helper()
	return uiEval[string](u, fmt.Sprintf("document.querySelector(%s)?.textContent ?? ''", jsString(css)))
}

func jsString(s string) string { b, _ := json.Marshal(s); return string(b) }

// signIn opens the UI and signs in with secret.
func (u *uiTab) signIn(secret api.Secret) {
	u.t.Helper()
	u.do(chromedp.Navigate(u.f.url+"/ui/"),
		chromedp.WaitVisible(chromedp.ID("credential")),
		chromedp.SendKeys(chromedp.ID("credential"), string(secret)),
		chromedp.Click(chromedp.ID("signin-button")))
}

func cardOf(id string) string { return fmt.Sprintf(`article[data-formation=%q]`, id) }

// open opens card from its line in the queue (a click, as an approver
// does) unless it is open, and waits for it to show.
func (u *uiTab) open(card string) {
	u.t.Helper()
	line := strings.Replace(card, "article", "#queue-lines button.line", 1)
	u.do(chromedp.WaitVisible(chromedp.CSS(line)))
	if uiEval[bool](u, fmt.Sprintf("document.querySelector(%s).hidden", jsString(card))) {
		u.do(chromedp.Click(chromedp.CSS(line)))
	}
	u.do(chromedp.WaitVisible(chromedp.CSS(card)))
}

// formBody is a POST /v1/formations body with a principal and attributes.
func formBody(snapshot, session, tool, args, principal, attributes string) []byte {
	return []byte(fmt.Sprintf(`{"snapshot":%q,"session":%q,"tool":%q,"arguments":%s,"principal":{"id":%q,"attributes":%s}}`,
		snapshot, session, tool, args, principal, attributes))
}

// pending forms a call that waits for approval and returns its id and digest.
func (f *fixture) pending(body []byte, approvals float64) (id, digest string) {
	f.t.Helper()
	r := f.do("POST", "/v1/formations", api.RoleHost, body)
	f.expect(r, http.StatusCreated, "")
	if r.Body["status"] != "pending_approval" || r.Body["approvalsRequired"] != approvals {
		f.t.Fatalf("want pending_approval with %v approvals: %s", approvals, r.Raw)
	}
	return r.Body["id"].(string), r.Body["digest"].(string)
}

// waitStatus waits until the formation has status over REST and returns it.
func (f *fixture) waitStatus(id, status string) map[string]any {
	f.t.Helper()
	var r reply
	testutil.EventuallyState(f.t, uiWait, "formation "+id+" to be "+status, func() bool {
		r = f.do("GET", "/v1/formations/"+id, api.RoleApprover, nil)
		f.expect(r, http.StatusOK, "")
		return r.Body["status"] == status
	}, func() string { return string(r.Raw) })
	return r.Body
}

func approvalsOf(body map[string]any) []map[string]any {
	var out []map[string]any
	for _, a := range body["approvals"].([]any) {
		out = append(out, a.(map[string]any))
	}
	return out
}

// TestUIApprovalsInBrowser drives the approval UI in headless chromium
// against a real authzd HTTP stack (embedded etcd, default policies): an
// approver signs in, reads the queue, approves and denies; a delete waits
// for a second approver; attacker-controlled values stay text; wrong and
// non-approver credentials are refused; self-approval is shown refused.
func TestUIApprovalsInBrowser(t *testing.T) {
	f, snap := newReadyFixture(t)
	browser := startChromium(t)
	const dev = `{"groups":["dev"]}`
	parent := t

	t.Run("approve", func(t *testing.T) {
		f.t = t
		defer func() { f.t = parent }()
		id, digest := f.pending(formBody(snap, "ui-a", "github/create_repository", `{"name":"ui-approve","private":true}`, "alice", dev), 1)
		u := f.openTab(t, browser)
		u.signIn(f.creds[api.RoleApprover])
		card := cardOf(id)
		u.open(card)
		if got := u.text("#account-id"); got != "approver" {
			t.Errorf("signed in as %q", got)
		}
		checks := map[string][]string{
			card + " h3":             {"github/create_repository"},
			card + " pre.arguments":  {`"name": "ui-approve"`, `"private": true`},
			card + " .source":        {"v1.4.0", "github-v1-4", "ghcr.io/github/github-mcp-server:v1.4.0", "sha256:"},
			card + " .principal":     {"alice"},
			card + " pre.attributes": {`"dev"`},
			card + " .digest":        {digest},
			card:                     {"none — runs only on the source", "allow-write", "rego", "cedar", "0 of 1 approval", "name_taken", "Exclusive with", "delete_repository", "Create a new repository"},
		}
		for sel, wants := range checks {
			got := u.text(sel)
			for _, want := range wants {
				if !strings.Contains(got, want) {
					t.Errorf("%s does not show %q: %q", sel, want, got)
				}
			}
		}
		u.do(chromedp.Click(chromedp.CSS(card + " button.approve")))
		body := f.waitStatus(id, "ready")
		as := approvalsOf(body)
		if len(as) != 1 || as[0]["approver"] != "approver" || as[0]["decision"] != "approve" || as[0]["digest"] != digest {
			t.Fatalf("approval not bound to the digest shown: %v", as)
		}
		entry := fmt.Sprintf(`#decision-log li[data-formation=%q]`, id)
		u.waitFor(fmt.Sprintf("document.querySelector(%s)", jsString(entry)))
		if got := u.text(entry); !strings.Contains(got, "now ready") {
			t.Errorf("decision log: %q", got)
		}

		// Sign-out forgets the credential and shows the sign-in again.
		u.do(chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("credential")))
		if uiEval[bool](u, `sessionStorage.length === 0 && localStorage.length === 0 && document.getElementById("queue").hidden && !document.querySelector("#cards article")`) != true {
			t.Error("sign-out left the credential or the queue behind")
		}
	})

	t.Run("deny with a reason", func(t *testing.T) {
		f.t = t
		defer func() { f.t = parent }()
		id, digest := f.pending(formBody(snap, "ui-b", "github/create_repository", `{"name":"ui-deny"}`, "alice", dev), 1)
		u := f.openTab(t, browser)
		u.signIn(f.creds[api.RoleApprover])
		card := cardOf(id)
		u.open(card)
		u.do(
			chromedp.SendKeys(chromedp.CSS(card+" textarea"), "not on the plan"),
			chromedp.Click(chromedp.CSS(card+" button.deny")))
		body := f.waitStatus(id, "denied")
		as := approvalsOf(body)
		if len(as) != 1 || as[0]["decision"] != "deny" || as[0]["reason"] != "not on the plan" || as[0]["digest"] != digest {
			t.Fatalf("deny: %v", as)
		}
	})

	t.Run("delete needs two approvals", func(t *testing.T) {
		f.t = t
		defer func() { f.t = parent }()
		// delete_repository requires get_repository completed earlier in the session.
		read := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "ui-c", "github/get_repository", `{"owner":"octo","repo":"old"}`, ""))
		f.expect(read, http.StatusCreated, "")
		a := f.do("POST", "/v1/formations/"+read.Body["id"].(string)+"/admit", api.RoleGateway, nil)
		f.expect(a, http.StatusOK, "")
		f.ranWithEffect(a)
		id, _ := f.pending(formBody(snap, "ui-c", "github/delete_repository", `{"owner":"octo","repo":"old"}`, "bob", `{"groups":["repo-admins"]}`), 2)

		u := f.openTab(t, browser)
		u.signIn(f.byID["approver-2"])
		card := cardOf(id)
		u.open(card)
		if got := u.text(card); !strings.Contains(got, "0 of 2 approvals") || !strings.Contains(got, "allow-delete-repo-admin") || !strings.Contains(got, "repo-admins") {
			t.Errorf("card before approval: %q", got)
		}
		u.do(chromedp.Click(chromedp.CSS(card + " button.approve")))
		u.waitFor(fmt.Sprintf("document.querySelector(%s)?.textContent.includes('1 of 2 approvals; still waiting')", jsString(card+" .result")))
		if body := f.waitStatus(id, "pending_approval"); len(approvalsOf(body)) != 1 {
			t.Fatalf("after one approval: %v", body["approvals"])
		}
		// The approver who decided is not offered a second decision (the
		// server would refuse it): both buttons off, and the card says why.
		offered := func() bool {
			return uiEval[bool](u, fmt.Sprintf(`!document.querySelector(%s).disabled || !document.querySelector(%s).disabled || document.querySelector(%s).hidden`,
				jsString(card+" button.approve"), jsString(card+" button.deny"), jsString(card+" p.mine")))
		}
		if offered() {
			t.Error("the approver who approved is offered Approve again")
		}

		// A refresh keeps the card, its tally, and a half-typed reason; the
		// timed refresh does not take the focus away either.
		refreshes := func() int { return uiEval[int](u, `Number(document.getElementById("queue").dataset.refreshes || 0)`) }
		n := refreshes()
		u.do(chromedp.SendKeys(chromedp.CSS(card+" textarea"), "half-typed"), chromedp.Click(chromedp.ID("refresh")))
		u.waitFor(fmt.Sprintf(`Number(document.getElementById("queue").dataset.refreshes) > %d`, n))
		u.do(chromedp.Focus(chromedp.CSS(card + " textarea")))
		n = refreshes()
		u.waitFor(fmt.Sprintf(`Number(document.getElementById("queue").dataset.refreshes) > %d`, n))
		if got := u.text(card + " .card-head"); !strings.Contains(got, "1 of 2 approvals") {
			t.Errorf("after refresh the card shows %q", got)
		}
		if offered() {
			t.Error("after a refresh, the approver who approved is offered Approve again")
		}
		sel := jsString(card + " textarea")
		if uiEval[bool](u, fmt.Sprintf(`document.querySelector(%s).value === "half-typed" && document.activeElement === document.querySelector(%s)`, sel, sel)) != true {
			t.Error("a refresh lost the half-typed reason or the focus")
		}
	})

	t.Run("attacker-controlled values stay text", func(t *testing.T) {
		f.t = t
		defer func() { f.t = parent }()
		args := `{"name":"x","description":"<img src=x onerror=\"window.__xss=1\"><script>window.__xss=2</script>\u202egnp.exe"}`
		attrs := `{"groups":["dev"],"note":"<img src=x onerror=\"window.__xss=3\"><b>bold</b>"}`
		id, _ := f.pending(formBody(snap, "ui-d", "github/create_repository", args, `mallory<script>window.__xss=4</script>`, attrs), 1)
		u := f.openTab(t, browser)
		u.signIn(f.creds[api.RoleApprover])
		card := cardOf(id)
		u.open(card)
		if got := u.text(card + " pre.arguments"); !strings.Contains(got, `<img src=x onerror=\"window.__xss=1\"><script>window.__xss=2</script>`) || !strings.Contains(got, `\u202egnp.exe`) {
			t.Errorf("arguments not shown as literal text: %q", got)
		}
		if got := u.text(card + " pre.attributes"); !strings.Contains(got, `<img src=x onerror=\"window.__xss=3\"><b>bold</b>`) {
			t.Errorf("attributes not shown as literal text: %q", got)
		}
		if got := u.text(card + " .principal"); got != `mallory<script>window.__xss=4</script>` {
			t.Errorf("principal: %q", got)
		}
		if !strings.Contains(u.text(card), "invisible or direction-changing characters") {
			t.Error("no warning about the direction override")
		}
		if n := uiEval[int](u, `document.querySelectorAll("#cards img, #cards script, #cards b").length`); n != 0 {
			t.Errorf("%d elements were made from formation data", n)
		}
		if got := uiEval[string](u, `typeof window.__xss`); got != "undefined" {
			t.Errorf("window.__xss is %s: script from the formation ran", got)
		}
	})

	t.Run("wrong and non-approver credentials", func(t *testing.T) {
		f.t = t
		defer func() { f.t = parent }()
		u := f.openTab(t, browser)
		u.signIn("fcd_approver_not-a-credential")
		u.waitFor(`document.getElementById("signin-error").textContent.includes("Authentication required")`)
		if got := u.text("#signin-error"); !strings.Contains(got, "401") || !strings.Contains(got, "a valid bearer credential is required") {
			t.Errorf("wrong credential: %q", got)
		}
		noQueue := `document.getElementById("queue").hidden && !document.querySelector("#cards article") && sessionStorage.length === 0 && !document.getElementById("signin").hidden`
		if !uiEval[bool](u, noQueue) {
			t.Error("a wrong credential showed the queue or was kept")
		}
		u.do(chromedp.SendKeys(chromedp.ID("credential"), string(f.creds[api.RoleHost])), chromedp.Click(chromedp.ID("signin-button")))
		u.waitFor(`document.getElementById("signin-error").textContent.includes("Role not allowed")`)
		if got := u.text("#signin-error"); !strings.Contains(got, "403") || !strings.Contains(got, "role host") || !strings.Contains(got, "approver role") {
			t.Errorf("host credential: %q", got)
		}
		if !uiEval[bool](u, noQueue) {
			t.Error("a host credential showed the queue or was kept")
		}
	})

	t.Run("recovery is shown", func(t *testing.T) {
		f.t = t
		defer func() { f.t = parent }()
		orig := f.do("POST", "/v1/formations", api.RoleHost, formBody(snap, "ui-r", "github/get_repository", `{"owner":"octo","repo":"gone"}`, "alice", dev))
		f.expect(orig, http.StatusCreated, "")
		id := orig.Body["id"].(string)
		adm := f.do("POST", "/v1/formations/"+id+"/admit", api.RoleHost, nil)
		f.expect(adm, http.StatusOK, "")
		f.ranWith(adm, `{"outcome":"failed","claim":"cl_test","failure":{"error":"not_found"}}`)
		rec := f.do("POST", "/v1/formations/"+id+"/recover", api.RoleHost, []byte(`{"arguments":{"owner":"octo","repo":"found"}}`))
		f.expect(rec, http.StatusCreated, "")
		u := f.openTab(t, browser)
		u.signIn(f.creds[api.RoleApprover])
		card := cardOf(rec.Body["id"].(string))
		u.open(card)
		got := u.text(card + " .recovery")
		for _, want := range []string{id, "2", "failed", "not_found", "prompt_user"} {
			if !strings.Contains(got, want) {
				t.Errorf("recovery does not show %q: %q", want, got)
			}
		}
	})

	t.Run("an operator sees the uncertain leases", func(t *testing.T) {
		f.t = t
		defer func() { f.t = parent }()
		leaseID, formation, epoch := f.uncertainLease(snap, "ui-u")
		u := f.openTab(t, browser)
		u.signIn(f.creds[api.RoleOperator])
		row := fmt.Sprintf(`#uncertain-rows tr[data-lease=%q]`, leaseID)
		u.do(chromedp.WaitVisible(chromedp.CSS(row)))
		if got := u.text("#account-id"); got != "operator" {
			t.Errorf("signed in as %q", got)
		}
		if !uiEval[bool](u, `document.getElementById("queue").hidden && !document.getElementById("uncertain").hidden`) {
			t.Error("an operator was shown the approval queue, or not the uncertain leases")
		}
		got := u.text(row)
		for _, want := range []string{leaseID, formation, "github/get_repository", "ui-u", "v1.4.0", "github-v1-4", epoch, "cl_ui-u",
			"authzd lease resolve", "--outcome effect|no_effect"} {
			if !strings.Contains(got, want) {
				t.Errorf("the row does not show %q: %q", want, got)
			}
		}
		if got := u.text(row + " .formation"); got != formation {
			t.Errorf("formation column %q", got)
		}
		if got := u.text(row + " .tool"); got != "github/get_repository" {
			t.Errorf("tool column %q", got)
		}
		// Read-only: nothing on the page posts.
		if n := uiEval[int](u, `document.querySelectorAll("#uncertain button:not(#uncertain-refresh), #uncertain textarea, #uncertain input").length`); n != 0 {
			t.Errorf("%d controls in the uncertain leases", n)
		}
		// Resolved elsewhere, it leaves the list at the next refresh.
		f.expect(f.do("POST", "/v1/leases/"+leaseID+"/resolve", api.RoleOperator, []byte(`{"outcome":"no_effect","reason":"checked"}`)), http.StatusOK, "")
		u.do(chromedp.Click(chromedp.ID("uncertain-refresh")))
		u.waitFor(fmt.Sprintf(`!document.querySelector(%s)`, jsString(row)))
		if !uiEval[bool](u, `!document.getElementById("uncertain-empty").hidden`) {
			t.Errorf("no uncertain lease left, but the page says: %q", u.text("#uncertain"))
		}
		// An approver is not shown them.
		a := f.openTab(t, browser)
		a.signIn(f.creds[api.RoleApprover])
		a.do(chromedp.WaitVisible(chromedp.ID("queue")))
		if !uiEval[bool](a, `document.getElementById("uncertain").hidden`) {
			t.Error("an approver was shown the uncertain leases")
		}
	})

	// Last: from here on, private create_repository calls capture a successor.
	t.Run("successor is shown", func(t *testing.T) {
		f.t = t
		defer func() { f.t = parent }()
		f.expect(f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.3"), nil)), http.StatusCreated, "")
		jws, err := manifest.Sign(exampleCertificate(t), f.issuerKey, manifest.TypCertificate)
		if err != nil {
			t.Fatal(err)
		}
		cert := f.do("POST", "/v1/certificates", api.RoleRegistrar, jws)
		f.expect(cert, http.StatusCreated, "")
		r := f.do("POST", "/v1/formations", api.RoleHost, formBody(snap, "ui-s", "github/create_repository", `{"name":"ui-successor","private":true}`, "alice", dev))
		f.expect(r, http.StatusCreated, "")
		succ, _ := r.Body["successor"].(map[string]any)
		if succ == nil {
			t.Fatalf("no successor captured: %s", r.Raw)
		}
		u := f.openTab(t, browser)
		u.signIn(f.creds[api.RoleApprover])
		card := cardOf(r.Body["id"].(string))
		u.open(card)
		got := u.text(card + " .successor")
		for _, want := range []string{"v1.3.0", succ["pool"].(string), succ["epoch"].(string), cert.Body["id"].(string), succ["issuer"].(string), `"visibility": "private"`, "github-create-repository/1", "Certificate expires"} {
			if !strings.Contains(got, want) {
				t.Errorf("successor does not show %q: %q", want, got)
			}
		}
		if got := u.text(card + " .decision-successor"); !strings.Contains(got, "allow") || !strings.Contains(got, cert.Body["id"].(string)) {
			t.Errorf("decision on the successor: %q", got)
		}
	})

	t.Run("self-approval is refused on the card", func(t *testing.T) {
		f.t = t
		defer func() { f.t = parent }()
		id, _ := f.pending(formBody(snap, "ui-f", "github/create_repository", `{"name":"ui-self"}`, "alice", dev), 1)
		u := f.openTab(t, browser)
		u.signIn(f.byID["alice"])
		card := cardOf(id)
		u.open(card)
		u.do(chromedp.Click(chromedp.CSS(card + " button.approve")))
		u.waitFor(fmt.Sprintf("document.querySelector(%s)?.textContent.includes('Self-approval is not allowed')", jsString(card+" .result")))
		if got := u.text(card + " .result"); !strings.Contains(got, "403") || !strings.Contains(got, "self-approval") {
			t.Errorf("self-approval problem: %q", got)
		}
		if body := f.waitStatus(id, "pending_approval"); len(approvalsOf(body)) != 0 {
			t.Fatalf("self-approval recorded: %v", body["approvals"])
		}
	})
}

// TestUILayoutInBrowser: the queue shows one line per pending formation;
// a drifted call's card shows the comparison table with the differing
// configuration marked and the omitted argument named; at 1280 and 390
// px wide nothing overflows sideways (screenshots in the test's temp
// directory); timestamps are local with the UTC value in their title;
// the favicon is served under the page's CSP.
func TestUILayoutInBrowser(t *testing.T) {
	f := newFixture(t, 0)
	f.expect(f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.3"), nil)), http.StatusCreated, "")
	v14 := f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.4"), nil))
	f.expect(v14, http.StatusCreated, "")
	cert, err := manifest.Sign(exampleCertificate(t), f.issuerKey, manifest.TypCertificate)
	if err != nil {
		t.Fatal(err)
	}
	f.expect(f.do("POST", "/v1/certificates", api.RoleRegistrar, cert), http.StatusCreated, "")
	snap := f.do("POST", "/v1/snapshots", api.RoleHost, nil)
	f.expect(snap, http.StatusCreated, "")
	sid := snap.Body["id"].(string)
	const dev = `{"groups":["dev"]}`
	f.pending(formBody(sid, "ui-l1", "github/create_repository", `{"name":"covered","private":true}`, "alice", dev), 1)
	drifted, _ := f.pending(formBody(sid, "ui-l2", "github/create_repository", `{"name":"payroll-exports"}`, "alice", dev), 1)
	f.pending(formBody(sid, "ui-l3", "github/create_repository", `{"name":"a-rather-long-repository-name-that-must-wrap-on-a-phone-screen","private":false}`, "alice", dev), 1)
	f.expect(f.do("POST", "/v1/epochs/"+v14.Body["epoch"].(string)+"/drain", api.RoleOperator, nil), http.StatusOK, "")
	list := f.do("GET", "/v1/formations?status=pending_approval", api.RoleApprover, nil)
	f.expect(list, http.StatusOK, "")
	pending := len(list.Body["formations"].([]any))

	fav := apitest.Do(t, "GET", f.url+"/ui/favicon.svg", "", nil, nil)
	if fav.Status != http.StatusOK || fav.Header.Get("Content-Type") != "image/svg+xml" || !strings.Contains(string(fav.Raw), "<svg") {
		t.Fatalf("favicon: %d %q", fav.Status, fav.Header.Get("Content-Type"))
	}

	browser := startChromium(t)
	u := f.openTab(t, browser)
	u.do(chromedp.EmulateViewport(1280, 900))
	u.signIn(f.creds[api.RoleApprover])
	u.waitFor(fmt.Sprintf(`document.querySelectorAll("#queue-lines li").length === %d`, pending))
	if n := uiEval[int](u, `document.querySelectorAll("#cards article:not([hidden])").length`); n != 0 {
		t.Errorf("%d cards open before any line was clicked", n)
	}
	if uiEval[string](u, `document.querySelector('link[rel="icon"]')?.getAttribute("href") ?? ""`) != "favicon.svg" {
		t.Error("the page links no favicon")
	}
	// The keyboard opens a card: a line is a button.
	line := fmt.Sprintf(`#queue-lines button.line[data-formation=%q]`, drifted)
	u.do(chromedp.Focus(chromedp.CSS(line)), chromedp.KeyEvent("\r"))
	card := cardOf(drifted)
	u.do(chromedp.WaitVisible(chromedp.CSS(card)))
	u.waitFor(fmt.Sprintf(`document.querySelector(%s)`, jsString(card+" table.compare")))
	if got := uiEval[string](u, fmt.Sprintf(`[...document.querySelectorAll(%s)].map((r) => r.querySelector("th").textContent).join("|")`,
		jsString(card+" table.compare tr.differs"))); !strings.Contains(got, "Config: repository.defaultVisibility") || strings.Contains(got, "Input schema") {
		t.Errorf("rows marked as differing: %q", got)
	}
	if got := u.text(card + " .omitted"); !strings.Contains(got, "private") {
		t.Errorf("the omitted private is not named: %q", got)
	}
	if cols := uiEval[int](u, fmt.Sprintf(`document.querySelectorAll(%s).length`, jsString(card+" table.compare thead th"))); cols != 3 {
		t.Errorf("compare table has %d header cells, want member, source, active", cols)
	}
	title := uiEval[string](u, fmt.Sprintf(`document.querySelector(%s)?.title ?? ""`, jsString(card+" time")))
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \(UTC\)$`).MatchString(title) {
		t.Errorf("a timestamp's title %q is not its UTC value", title)
	}
	dir := t.TempDir()
	for _, width := range []int64{1280, 390} {
		u.do(chromedp.EmulateViewport(width, 900))
		u.waitFor(fmt.Sprintf(`innerWidth === %d`, width))
		if !uiEval[bool](u, `document.documentElement.scrollWidth <= innerWidth`) {
			t.Errorf("%d px: the page is %v px wide", width, uiEval[int](u, `document.documentElement.scrollWidth`))
		}
		ctx, cancel := context.WithTimeout(u.ctx, uiWait)
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		cancel()
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		file := fmt.Sprintf("%s/approvals-%d.png", dir, width)
		if err := os.WriteFile(file, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", file)
	}

	// The operator's view fits at 1280 px.
	o := f.openTab(t, browser)
	o.do(chromedp.EmulateViewport(1280, 900))
	o.signIn(f.creds[api.RoleOperator])
	o.do(chromedp.WaitVisible(chromedp.ID("uncertain")))
	if !uiEval[bool](o, `document.documentElement.scrollWidth <= innerWidth`) {
		t.Errorf("operator view at 1280 px is %v px wide", uiEval[int](o, `document.documentElement.scrollWidth`))
	}
}
