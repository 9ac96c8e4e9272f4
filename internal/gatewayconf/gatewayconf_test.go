package gatewayconf_test

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/fcd-authz/fcd/internal/gatewayconf"
)

const credential = "gw-cred.Zm9v~bar+/="

func data(t *testing.T, def string) gatewayconf.Data {
	t.Helper()
	d, err := gatewayconf.NewData("127.0.0.1:8080", "http://127.0.0.1:7070", credential,
		map[string]string{"github-v1-4": "http://127.0.0.1:9014", "github-v1-3": "127.0.0.1:9013"}, def)
	if err != nil {
		t.Fatal(err)
	}
	if d.AuthzdGRPC, err = gatewayconf.ParseEndpoint("127.0.0.1:7071"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"alice", "bob"} {
		u, err := gatewayconf.NewUser(name, name+"-password", bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		d.Users = append(d.Users, u)
	}
	d.CallerJWT = gatewayconf.JWTIssuer{Issuer: "https://idp.example", JWKSFile: "/etc/envoy/callers.jwks.json"}
	return d
}

func render(t *testing.T, name string, d gatewayconf.Data) string {
	t.Helper()
	b, err := gatewayconf.Render(name, d)
	if err != nil {
		t.Fatalf("render %s: %v", name, err)
	}
	return string(b)
}

func TestNewData(t *testing.T) {
	d := data(t, "github-v1-4")
	if d.Listen.HostPort != "127.0.0.1:8080" || d.Listen.Host != "127.0.0.1" || d.Listen.Port != 8080 || d.Listen.URL != "http://127.0.0.1:8080" {
		t.Errorf("listen %+v", d.Listen)
	}
	if len(d.Pools) != 2 || d.Pools[0].Name != "github-v1-3" || d.Pools[0].Index != 0 || d.Pools[1].Name != "github-v1-4" ||
		d.Pools[0].URL != "http://127.0.0.1:9013" || d.Pools[1].Port != 9014 {
		t.Errorf("pools %+v, want sorted by name", d.Pools)
	}
	if p := d.DefaultPool(); p == nil || p.Name != "github-v1-4" {
		t.Errorf("default pool %+v", p)
	}
	if p := data(t, "").DefaultPool(); p != nil {
		t.Errorf("default pool %+v, want none", p)
	}

	pools := map[string]string{"p": "http://127.0.0.1:1"}
	for _, c := range []struct {
		name                 string
		listen, authzd, cred string
		pools                map[string]string
		def                  string
		wantErr              string
	}{
		{"credential with a quote", "127.0.0.1:1", "http://127.0.0.1:2", `a"b`, pools, "", "credential"},
		{"credential with $", "127.0.0.1:1", "http://127.0.0.1:2", "a$b", pools, "", "credential"},
		{"credential with a brace", "127.0.0.1:1", "http://127.0.0.1:2", "a{b}", pools, "", "credential"},
		{"empty credential", "127.0.0.1:1", "http://127.0.0.1:2", "", pools, "", "credential"},
		{"authzd with a path", "127.0.0.1:1", "http://127.0.0.1:2/v1", "c", pools, "", "authzd"},
		{"authzd https", "127.0.0.1:1", "https://127.0.0.1:2", "c", pools, "", "authzd"},
		{"authzd without port", "127.0.0.1:1", "http://localhost", "c", pools, "", "authzd"},
		{"no pools", "127.0.0.1:1", "http://127.0.0.1:2", "c", nil, "", "pools"},
		{"bad pool name", "127.0.0.1:1", "http://127.0.0.1:2", "c", map[string]string{"Git Hub": "http://127.0.0.1:1"}, "", "name"},
		{"pool with a path", "127.0.0.1:1", "http://127.0.0.1:2", "c", map[string]string{"p": "http://127.0.0.1:1/mcp"}, "", "pool"},
		{"unknown default", "127.0.0.1:1", "http://127.0.0.1:2", "c", pools, "q", "default"},
	} {
		_, err := gatewayconf.NewData(c.listen, c.authzd, c.cred, c.pools, c.def)
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%s: error %v, want one about %s", c.name, err, c.wantErr)
		}
	}
}

// TestUsers: NewUser hashes with bcrypt and refuses names that would be
// syntax somewhere; Htpasswd writes nginx's user file.
func TestUsers(t *testing.T) {
	u, err := gatewayconf.NewUser("alice@example.com", "s3cret:with colon", bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	if bcrypt.CompareHashAndPassword([]byte(u.Hash), []byte("s3cret:with colon")) != nil || u.Name != "alice@example.com" {
		t.Errorf("user %+v: the hash does not check the password", u)
	}
	if cost, _ := bcrypt.Cost([]byte(u.Hash)); cost != bcrypt.MinCost {
		t.Errorf("cost %d", cost)
	}
	file, err := gatewayconf.Htpasswd([]gatewayconf.User{u, {Name: "bob", Hash: u.Hash}})
	if err != nil || string(file) != "alice@example.com:"+u.Hash+"\nbob:"+u.Hash+"\n" {
		t.Errorf("htpasswd %q, %v", file, err)
	}
	for _, c := range []struct{ name, password string }{
		{"", "p"}, {"al ice", "p"}, {"al:ice", "p"}, {"{alice}", "p"}, {"al$ice", "p"}, {"-alice", "p"}, {"alice\n", "p"}, {"alice", ""},
	} {
		if _, err := gatewayconf.NewUser(c.name, c.password, bcrypt.MinCost); err == nil {
			t.Errorf("NewUser(%q, %q) accepted", c.name, c.password)
		}
	}
	for _, bad := range []gatewayconf.User{{Name: "alice", Hash: "{PLAIN}secret"}, {Name: "al ice", Hash: u.Hash}, {Name: "alice", Hash: u.Hash + "}"}} {
		if _, err := gatewayconf.Htpasswd([]gatewayconf.User{bad}); err == nil {
			t.Errorf("Htpasswd accepted %+v", bad)
		}
		d := data(t, "")
		d.Users = []gatewayconf.User{bad}
		if _, err := gatewayconf.Render(gatewayconf.Caddyfile, d); err == nil {
			t.Errorf("Render accepted %+v", bad)
		}
	}
}

// TestRenderNeedsCallers: a file that authenticates its clients does not
// render without them: the identity binding is on by default.
func TestRenderNeedsCallers(t *testing.T) {
	for _, c := range []struct {
		file, want string
		drop       func(*gatewayconf.Data)
	}{
		{gatewayconf.Nginx, "Users is required", func(d *gatewayconf.Data) { d.Users = nil }},
		{gatewayconf.Caddyfile, "Users is required", func(d *gatewayconf.Data) { d.Users = nil }},
		{gatewayconf.TraefikDynamic, "Users is required", func(d *gatewayconf.Data) { d.Users = nil }},
		{gatewayconf.Envoy, "CallerJWT.Issuer is required", func(d *gatewayconf.Data) { d.CallerJWT.Issuer = "" }},
		{gatewayconf.Envoy, "CallerJWT.JWKSFile is required", func(d *gatewayconf.Data) { d.CallerJWT.JWKSFile = "" }},
		{gatewayconf.Envoy, "CallerJWT.Issuer", func(d *gatewayconf.Data) { d.CallerJWT.Issuer = `https://idp"` }},
	} {
		d := data(t, "github-v1-4")
		c.drop(&d)
		if _, err := gatewayconf.Render(c.file, d); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error about %s", c.file, err, c.want)
		}
	}
}

// TestRenderAll: every file renders, with and without a default pool, and
// leaves no template action behind.
func TestRenderAll(t *testing.T) {
	for _, def := range []string{"github-v1-4", ""} {
		d := data(t, def)
		for _, name := range gatewayconf.Names() {
			out := render(t, name, d)
			if strings.Contains(out, "{{") || strings.Contains(out, "<no value>") {
				t.Errorf("%s (default %q): template text left in the output", name, def)
			}
			if !strings.Contains(out, credential) && name != gatewayconf.Traefik {
				t.Errorf("%s: credential not rendered", name)
			}
			for _, p := range d.Pools {
				if !strings.Contains(out, p.Name) && name != gatewayconf.Traefik {
					t.Errorf("%s: pool %s not rendered", name, p.Name)
				}
			}
		}
	}
}

// TestEnvoyConfig decodes the rendered envoy.yaml into Envoy's v3
// bootstrap proto, strictly (an unknown or misspelt field fails), and
// runs the protos' validation rules, in the typed configs too. Envoy itself
// is not available here; this is as close as the tests get to it. Both
// variants are checked: the HTTP service (as shipped) and the gRPC
// service (the commented block swapped in).
func TestEnvoyConfig(t *testing.T) {
	for _, def := range []string{"github-v1-4", ""} {
		text := render(t, gatewayconf.Envoy, data(t, def))
		grpc := grpcVariant(t, text)
		for variant, y := range map[string]string{"http_service": text, "grpc_service": grpc} {
			b := decodeEnvoy(t, y)
			ea, ok := findAny(t, b, "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz").(*extauthzv3.ExtAuthz)
			if !ok {
				t.Fatal("ext_authz config is not an ExtAuthz")
			}
			if !ea.GetClearRouteCache() || ea.GetFailureModeAllow() || ea.GetWithRequestBody().GetMaxRequestBytes() == 0 {
				t.Errorf("%s: ext_authz must clear the route cache, fail closed and send the body: %v", variant, ea)
			}
			hcm, ok := findAny(t, b, "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager").(*hcmv3.HttpConnectionManager)
			if !ok {
				t.Fatal("no HttpConnectionManager")
			}
			var filters []string
			for _, f := range hcm.GetHttpFilters() {
				filters = append(filters, f.GetName())
			}
			if strings.Join(filters, ",") != "envoy.filters.http.header_mutation,envoy.filters.http.jwt_authn,envoy.filters.http.ext_authz,envoy.filters.http.router" {
				t.Errorf("http filters %v: want header_mutation, jwt_authn, ext_authz, router in that order", filters)
			}
			// The caller: the client's own fcd-caller removed, then set from
			// the verified JWT's sub, required on every request, and sent
			// to authzd.
			hm, ok := findAny(t, b, "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation").(*headermutationv3.HeaderMutation)
			removed := map[string]bool{}
			for _, m := range hm.GetMutations().GetRequestMutations() {
				removed[m.GetRemove()] = true
			}
			if !ok || !removed["fcd-caller"] || !removed["fcd-principal"] || !removed["fcd-dispatch-token"] {
				t.Errorf("%s: header_mutation removes %v, want fcd-caller among them", variant, removed)
			}
			ja, ok := findAny(t, b, "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication").(*jwtauthnv3.JwtAuthentication)
			if !ok {
				t.Fatal("jwt_authn config is not a JwtAuthentication")
			}
			p := ja.GetProviders()["fcd_callers"]
			if c := p.GetClaimToHeaders(); p.GetIssuer() != "https://idp.example" || p.GetLocalJwks().GetFilename() != "/etc/envoy/callers.jwks.json" ||
				p.GetForward() || len(c) != 1 || c[0].GetHeaderName() != "fcd-caller" || c[0].GetClaimName() != "sub" {
				t.Errorf("%s: jwt provider %v", variant, p)
			}
			if rs := ja.GetRules(); len(rs) != 1 || rs[0].GetMatch().GetPrefix() != "/" || rs[0].GetRequires().GetProviderName() != "fcd_callers" {
				t.Errorf("%s: jwt rules %v, want every request to need a caller", variant, rs)
			}
			var sent []string
			for _, p := range ea.GetAllowedHeaders().GetPatterns() {
				sent = append(sent, p.GetExact())
			}
			// The caller, and the client's trace context (authzd continues
			// the call's trace: internal/e2e's TestTraceThroughGatewayAndFence).
			for _, h := range []string{"fcd-caller", "traceparent", "tracestate"} {
				if !slices.Contains(sent, h) {
					t.Errorf("%s: allowed_headers %v, want %s", variant, sent, h)
				}
			}
			// A route per pool on Fcd-Target, the session route when there
			// is a default pool, and the 502 fallback.
			routes := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()
			want := map[string]string{"github-v1-3": "fcd_pool_github-v1-3", "github-v1-4": "fcd_pool_github-v1-4"}
			for _, r := range routes {
				hs := r.GetMatch().GetHeaders()
				switch {
				case len(hs) == 1 && hs[0].GetStringMatch().GetExact() != "":
					if want[hs[0].GetStringMatch().GetExact()] != r.GetRoute().GetCluster() || hs[0].GetName() != "fcd-target" {
						t.Errorf("route %v", r)
					}
					delete(want, hs[0].GetStringMatch().GetExact())
				case len(hs) == 1 && hs[0].GetPresentMatch() && hs[0].GetInvertMatch():
					if def == "" || r.GetRoute().GetCluster() != "fcd_pool_"+def {
						t.Errorf("session route %v with default %q", r, def)
					}
				case len(hs) == 0:
					if r.GetDirectResponse().GetStatus() != 502 || r != routes[len(routes)-1] {
						t.Errorf("fallback route %v, want the last one, 502", r)
					}
				}
			}
			if len(want) != 0 {
				t.Errorf("no route for %v", want)
			}
			switch variant {
			case "http_service":
				hs := ea.GetHttpService()
				if hs == nil || hs.GetPathPrefix() != "/v1/ext_authz" || hs.GetServerUri().GetCluster() != "fcd_authzd" {
					t.Fatalf("%s: %v", variant, hs)
				}
				add := hs.GetAuthorizationRequest().GetHeadersToAdd()
				if len(add) != 1 || add[0].GetKey() != "authorization" || add[0].GetValue() != "Bearer "+credential {
					t.Errorf("%s: headers_to_add %v, want the gateway credential", variant, add)
				}
				var up []string
				for _, p := range hs.GetAuthorizationResponse().GetAllowedUpstreamHeaders().GetPatterns() {
					up = append(up, p.GetExact())
				}
				if strings.Join(up, ",") != "fcd-dispatch-token,fcd-target" {
					t.Errorf("%s: allowed_upstream_headers %v", variant, up)
				}
			case "grpc_service":
				gs := ea.GetGrpcService()
				md := gs.GetInitialMetadata()
				if gs.GetEnvoyGrpc().GetClusterName() != "fcd_authzd_grpc" || len(md) != 1 ||
					md[0].GetKey() != "authorization" || md[0].GetValue() != "Bearer "+credential {
					t.Errorf("%s: %v", variant, gs)
				}
			}
		}
	}
}

// grpcVariant swaps the http_service block of a rendered envoy.yaml for
// the commented grpc_service block, as its comment tells a reader to.
func grpcVariant(t *testing.T, text string) string {
	t.Helper()
	var out []string
	block := ""
	seen := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		switch trimmed {
		case "# http-service-begin", "# grpc-service-begin":
			block = strings.TrimSuffix(strings.TrimPrefix(trimmed, "# "), "-begin")
			seen[block] = true
			continue
		case "# http-service-end", "# grpc-service-end":
			block = ""
			continue
		}
		switch block {
		case "http-service":
			// dropped
		case "grpc-service":
			indent := line[:len(line)-len(strings.TrimLeft(line, " "))]
			rest := strings.TrimPrefix(strings.TrimPrefix(trimmed, "#"), " ")
			out = append(out, indent+rest)
		default:
			out = append(out, line)
		}
	}
	if !seen["http-service"] || !seen["grpc-service"] {
		t.Fatalf("envoy.yaml: the http-service/grpc-service markers are missing")
	}
	return strings.Join(out, "\n")
}

func decodeEnvoy(t *testing.T, y string) *bootstrapv3.Bootstrap {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatalf("envoy.yaml is not YAML: %v\n%s", err, y)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("envoy.yaml does not decode as an Envoy v3 Bootstrap: %v\n%s", err, y)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml: bootstrap validation: %v", err)
	}
	validateAnys(t, b.ProtoReflect())
	return &b
}

// validateAnys unpacks every Any under m (typed_config and the like) and
// runs its message's validation rules, recursively; protoc-gen-validate
// does not look inside an Any.
func validateAnys(t *testing.T, m protoreflect.Message) {
	t.Helper()
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		visit := func(msg protoreflect.Message) {
			if a, ok := msg.Interface().(*anypb.Any); ok {
				inner, err := a.UnmarshalNew()
				if err != nil {
					t.Errorf("envoy.yaml: %s: %v", a.GetTypeUrl(), err)
					return
				}
				if v, ok := inner.(interface{ ValidateAll() error }); ok {
					if err := v.ValidateAll(); err != nil {
						t.Errorf("envoy.yaml: %s: %v", a.GetTypeUrl(), err)
					}
				}
				validateAnys(t, inner.ProtoReflect())
				return
			}
			validateAnys(t, msg)
		}
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				visit(v.List().Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				visit(mv.Message())
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			visit(v.Message())
		}
		return true
	})
}

// findAny returns the first Any of the given type URL under m, unpacked.
func findAny(t *testing.T, m proto.Message, typeURL string) proto.Message {
	t.Helper()
	var found proto.Message
	var walk func(protoreflect.Message)
	walk = func(msg protoreflect.Message) {
		if found != nil {
			return
		}
		if a, ok := msg.Interface().(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			if err != nil {
				return
			}
			if a.GetTypeUrl() == typeURL {
				found = inner
				return
			}
			walk(inner.ProtoReflect())
			return
		}
		msg.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := 0; i < v.List().Len(); i++ {
					walk(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					walk(mv.Message())
					return true
				})
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				walk(v.Message())
			}
			return found == nil
		})
	}
	walk(m.ProtoReflect())
	if found == nil {
		t.Fatalf("envoy.yaml: no %s", typeURL)
	}
	return found
}

// TestTraefikConfig: Traefik is not available here; check that both files
// are YAML with the routers, middlewares and services the comments
// describe.
func TestTraefikConfig(t *testing.T) {
	d := data(t, "github-v1-4")
	var static struct {
		EntryPoints map[string]struct {
			Address string `json:"address"`
		} `json:"entryPoints"`
		Providers struct {
			File struct {
				Filename string `json:"filename"`
			} `json:"file"`
		} `json:"providers"`
	}
	// Only the keys named above are checked; the others are Traefik's.
	if err := yaml.Unmarshal([]byte(render(t, gatewayconf.Traefik, d)), &static); err != nil {
		t.Fatalf("traefik.yml: %v", err)
	}
	if static.EntryPoints["mcp"].Address != "127.0.0.1:8080" || static.EntryPoints["fcd-routed"].Address == "" || static.Providers.File.Filename == "" {
		t.Errorf("traefik.yml: %+v", static)
	}

	type router struct {
		EntryPoints []string `json:"entryPoints"`
		Rule        string   `json:"rule"`
		Middlewares []string `json:"middlewares"`
		Service     string   `json:"service"`
	}
	var dyn struct {
		HTTP struct {
			Routers     map[string]router `json:"routers"`
			Middlewares map[string]struct {
				BasicAuth *struct {
					Realm        string   `json:"realm"`
					HeaderField  string   `json:"headerField"`
					RemoveHeader bool     `json:"removeHeader"`
					Users        []string `json:"users"`
				} `json:"basicAuth"`
				Headers *struct {
					CustomRequestHeaders map[string]string `json:"customRequestHeaders"`
				} `json:"headers"`
				ForwardAuth *struct {
					Address             string   `json:"address"`
					TrustForwardHeader  bool     `json:"trustForwardHeader"`
					AuthRequestHeaders  []string `json:"authRequestHeaders"`
					AuthResponseHeaders []string `json:"authResponseHeaders"`
				} `json:"forwardAuth"`
			} `json:"middlewares"`
			Services map[string]struct {
				LoadBalancer struct {
					PassHostHeader     bool `json:"passHostHeader"`
					ResponseForwarding struct {
						FlushInterval string `json:"flushInterval"`
					} `json:"responseForwarding"`
					Servers []struct {
						URL string `json:"url"`
					} `json:"servers"`
				} `json:"loadBalancer"`
			} `json:"services"`
		} `json:"http"`
	}
	// Strict: every key in the file is one of the above, spelt as Traefik
	// spells it.
	if err := yaml.UnmarshalStrict([]byte(render(t, gatewayconf.TraefikDynamic, d)), &dyn); err != nil {
		t.Fatalf("traefik-dynamic.yml: %v", err)
	}
	h := dyn.HTTP
	auth := h.Routers["fcd-authorize"]
	if strings.Join(auth.Middlewares, ",") != "fcd-strip,fcd-callers,fcd-credential,fcd-authorize,fcd-drop-credential" || auth.Service != "fcd-routed" {
		t.Errorf("router fcd-authorize %+v", auth)
	}
	ba := h.Middlewares["fcd-callers"].BasicAuth
	if ba == nil || ba.HeaderField != "Fcd-Caller" || !ba.RemoveHeader || len(ba.Users) != 2 ||
		ba.Users[0] != "alice:"+d.Users[0].Hash || ba.Users[1] != "bob:"+d.Users[1].Hash {
		t.Errorf("fcd-callers %+v", ba)
	}
	fa := h.Middlewares["fcd-authorize"].ForwardAuth
	if fa == nil || fa.Address != "http://127.0.0.1:7070/v1/forward_auth" || fa.TrustForwardHeader ||
		strings.Join(fa.AuthResponseHeaders, ",") != "Fcd-Dispatch-Token,Fcd-Target" || !slices.Contains(fa.AuthRequestHeaders, "Fcd-Caller") ||
		!slices.Contains(fa.AuthRequestHeaders, "Traceparent") || !slices.Contains(fa.AuthRequestHeaders, "Tracestate") {
		t.Errorf("forwardAuth %+v", fa)
	}
	if c := h.Middlewares["fcd-credential"].Headers; c == nil || c.CustomRequestHeaders["Authorization"] != "Bearer "+credential {
		t.Errorf("fcd-credential %+v", c)
	}
	if c := h.Middlewares["fcd-drop-credential"].Headers; c == nil || c.CustomRequestHeaders["Authorization"] != "" || c.CustomRequestHeaders["Fcd-Caller"] != "" ||
		c.CustomRequestHeaders["Fcd-Formation"] != "" || len(c.CustomRequestHeaders) != 3 {
		t.Errorf("fcd-drop-credential %+v", c)
	}
	// Every fcd header a client must not send is removed before authzd is
	// asked (Fcd-Formation, which authzd decides on, after).
	strip := h.Middlewares["fcd-strip"].Headers
	if strip == nil {
		t.Fatal("no fcd-strip middleware")
	}
	for _, name := range gatewayconf.ClientHeaders() {
		if name == "Fcd-Formation" {
			continue
		}
		if v, ok := strip.CustomRequestHeaders[name]; !ok || v != "" {
			t.Errorf("fcd-strip does not remove %s: %+v", name, strip.CustomRequestHeaders)
		}
	}
	rule := regexp.MustCompile("^Header\\(`Fcd-Target`, `([a-z0-9.-]+)`\\)$")
	for _, p := range d.Pools {
		r := h.Routers["fcd-pool-"+p.Name]
		if m := rule.FindStringSubmatch(r.Rule); m == nil || m[1] != p.Name || r.Service != "fcd-pool-"+p.Name ||
			strings.Join(r.EntryPoints, ",") != "fcd-routed" {
			t.Errorf("router for %s: %+v", p.Name, r)
		}
		s := h.Services["fcd-pool-"+p.Name].LoadBalancer
		if len(s.Servers) != 1 || s.Servers[0].URL != p.URL || !s.PassHostHeader {
			t.Errorf("service for %s: %+v", p.Name, s)
		}
	}
	if r := h.Routers["fcd-session"]; r.Service != "fcd-pool-github-v1-4" {
		t.Errorf("session router %+v", r)
	}
}

// TestGatewayConfigEnvoy: what `authzd gateway config envoy` writes (through
// Configure, as the command runs it) decodes strictly into Envoy's v3
// protos and validates, with every server of a pool as an endpoint, the
// vhost removing what authzd decided on, and no gRPC cluster unless
// --authzd-grpc is given.
func TestGatewayConfigEnvoy(t *testing.T) {
	cred := filepath.Join(t.TempDir(), "cred")
	if err := os.WriteFile(cred, []byte(credential+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, grpc := range []string{"", "127.0.0.1:7071"} {
		args := []string{"--credential-file", cred, "--pool", "a=127.0.0.1:9001,127.0.0.1:9002", "--pool", "b=127.0.0.1:9003", "--default", "a",
			"--jwt-issuer", "https://idp.example", "--jwt-jwks", "/etc/envoy/jwks.json"}
		if grpc != "" {
			args = append(args, "--authzd-grpc", grpc)
		}
		out, err := gatewayconf.Configure(gatewayconf.KindEnvoy, args, func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		b := decodeEnvoy(t, string(out.Files[0].Text))
		clusters := map[string]int{}
		for _, c := range b.GetStaticResources().GetClusters() {
			n := 0
			for _, e := range c.GetLoadAssignment().GetEndpoints() {
				n += len(e.GetLbEndpoints())
			}
			clusters[c.GetName()] = n
		}
		if clusters["fcd_pool_a"] != 2 || clusters["fcd_pool_b"] != 1 || clusters["fcd_authzd"] != 1 {
			t.Errorf("clusters (endpoints) %v", clusters)
		}
		if _, ok := clusters["fcd_authzd_grpc"]; ok != (grpc != "") {
			t.Errorf("--authzd-grpc %q: gRPC cluster defined %v", grpc, ok)
		}
		hcm := findAny(t, b, "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager").(*hcmv3.HttpConnectionManager)
		vh := hcm.GetRouteConfig().GetVirtualHosts()[0]
		if got := strings.Join(vh.GetRequestHeadersToRemove(), ","); got != "fcd-formation,fcd-caller,fcd-snapshot,fcd-session,fcd-server,fcd-principal" {
			t.Errorf("virtual host removes %s", got)
		}
	}
}

// TestGatewayExamplesStripClientHeaders: each example names every header of
// gatewayconf.ClientHeaders in a removal of its own syntax (the real nginx
// and Caddy are checked in internal/gatewaytest, where forged headers are
// sent).
func TestGatewayExamplesStripClientHeaders(t *testing.T) {
	d := data(t, "github-v1-4")
	for name, remove := range map[string]func(h string) string{
		gatewayconf.Nginx:     func(h string) string { return `proxy_set_header ` + h },
		gatewayconf.Caddyfile: func(h string) string { return "request_header -" + h },
		gatewayconf.Envoy:     func(h string) string { return "remove: " + strings.ToLower(h) + "\n" },
		gatewayconf.TraefikDynamic: func(h string) string {
			return h + `: ""`
		},
	} {
		text := render(t, name, d)
		if name == gatewayconf.Envoy {
			// The virtual host's request_headers_to_remove, as "remove: ".
			text = regexp.MustCompile(`(?m)^\s*- (fcd-[a-z-]+)$`).ReplaceAllString(text, "remove: $1")
		}
		for _, h := range gatewayconf.ClientHeaders() {
			if !strings.Contains(text, remove(h)) {
				t.Errorf("%s does not remove %s (no %q)", name, h, remove(h))
			}
		}
	}
}
