package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const chartDir = "helm/fcd"

// The value sets the chart is rendered with: each a way to deploy it.
var valueSets = []struct {
	name   string
	values string
}{
	{name: "defaults"},
	{name: "external etcd with TLS", values: `
etcd:
  mode: external
  external:
    endpoints: [https://etcd-0.example:2379, https://etcd-1.example:2379, https://etcd-2.example:2379]
    clientSecret: fcd-etcd-client
authzd:
  replicas: 3
  grpcPort: 9090
  settings: {tokenLifetime: 1m, formationRate: 5, auditArguments: redacted}
`},
	{name: "bundled etcd of five", values: `
etcd:
  mode: bundled
  bundled: {replicas: 5, storage: {size: 10Gi, storageClassName: fast}}
image: {digest: "sha256:0000000000000000000000000000000000000000000000000000000000000000"}
`},
	{name: "sidecar example and gateway", values: `
example:
  enabled: true
  artifact: sha256:1111111111111111111111111111111111111111111111111111111111111111
  config: sha256:2222222222222222222222222222222222222222222222222222222222222222
  generation: 3
gateway:
  files:
    nginx.conf: "events {}\n"
`},
}

// object is one rendered document, decoded into its Kubernetes type.
type object struct {
	source string // the template it came from
	kind   string
	name   string
	obj    any
}

// render renders the chart with values (YAML) as release fcd in
// namespace fcd, as helm install would, and returns the documents of
// every template but NOTES.txt.
func render(t *testing.T, values string) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatal(err)
	}
	if err := chartutil.ProcessDependenciesWithMerge(ch, vals); err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "fcd", Namespace: "fcd", IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine.Engine{Strict: true}.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	docs := map[string]string{}
	for file, text := range out {
		if strings.HasSuffix(file, "NOTES.txt") {
			continue
		}
		for i, doc := range releaseutil.SplitManifests(text) {
			if strings.TrimSpace(doc) != "" {
				docs[fmt.Sprintf("%s#%s", file, i)] = doc
			}
		}
	}
	return docs, nil
}

// decodeStrictly decodes each document into the Kubernetes type of its
// apiVersion and kind, refusing any field the type does not have.
func decodeStrictly(t *testing.T, docs map[string]string) []object {
	t.Helper()
	types := map[string]func() any{
		"v1/ConfigMap":                       func() any { return &corev1.ConfigMap{} },
		"v1/Secret":                          func() any { return &corev1.Secret{} },
		"v1/Service":                         func() any { return &corev1.Service{} },
		"apps/v1/Deployment":                 func() any { return &appsv1.Deployment{} },
		"apps/v1/StatefulSet":                func() any { return &appsv1.StatefulSet{} },
		"policy/v1/PodDisruptionBudget":      func() any { return &policyv1.PodDisruptionBudget{} },
		"networking.k8s.io/v1/NetworkPolicy": func() any { return &networkingv1.NetworkPolicy{} },
	}
	var objs []object
	for _, source := range slices.Sorted(maps.Keys(docs)) {
		js, err := yaml.YAMLToJSON([]byte(docs[source]))
		if err != nil {
			t.Fatalf("%s: %v\n%s", source, err, docs[source])
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(js, &tm); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		newObj, ok := types[tm.APIVersion+"/"+tm.Kind]
		if !ok {
			t.Fatalf("%s: a %s/%s, which the test does not know", source, tm.APIVersion, tm.Kind)
		}
		obj := newObj()
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			t.Fatalf("%s: not a valid %s: %v\n%s", source, tm.Kind, err, docs[source])
		}
		var om struct{ Metadata metav1.ObjectMeta }
		_ = json.Unmarshal(js, &om)
		objs = append(objs, object{source: source, kind: tm.Kind, name: om.Metadata.Name, obj: obj})
	}
	return objs
}

// workload is a pod template and what owns it.
type workload struct {
	kind, name string
	selector   *metav1.LabelSelector
	pod        corev1.PodTemplateSpec
	replicas   int32
}

func workloads(objs []object) []workload {
	var ws []workload
	for _, o := range objs {
		switch x := o.obj.(type) {
		case *appsv1.Deployment:
			ws = append(ws, workload{o.kind, o.name, x.Spec.Selector, x.Spec.Template, deref(x.Spec.Replicas)})
		case *appsv1.StatefulSet:
			ws = append(ws, workload{o.kind, o.name, x.Spec.Selector, x.Spec.Template, deref(x.Spec.Replicas)})
		}
	}
	return ws
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// TestChartRenders renders the chart with each value set, decodes every
// object strictly into its Kubernetes type, and checks what a deployment
// of fcd relies on: the pods run as non-root with read-only roots and no
// capabilities, each container asks for resources, authzd's probes are
// /healthz and /readyz, a PodDisruptionBudget and a Service select each
// authzd pod, every volume a container mounts and every ConfigMap it
// names exist, Secrets are referenced rather than written (the gateway's
// given files aside), and authzd reaches exactly the etcd members the
// chart runs or was given.
func TestChartRenders(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			docs, err := render(t, vs.values)
			if err != nil {
				t.Fatal(err)
			}
			objs := decodeStrictly(t, docs)
			for _, p := range checkObjects(objs) {
				t.Error(p)
			}
		})
	}
}

// checkObjects returns what is wrong with a rendered release.
func checkObjects(objs []object) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	configMaps, secrets := map[string]*corev1.ConfigMap{}, map[string]bool{}
	var services []*corev1.Service
	var pdbs []*policyv1.PodDisruptionBudget
	for _, o := range objs {
		switch x := o.obj.(type) {
		case *corev1.ConfigMap:
			configMaps[o.name] = x
		case *corev1.Secret:
			secrets[o.name] = true
			if o.name != "fcd-gateway" {
				bad("%s: a Secret written by the chart; reference an existing one", o.source)
			}
		case *corev1.Service:
			services = append(services, x)
		case *policyv1.PodDisruptionBudget:
			pdbs = append(pdbs, x)
		}
	}
	var authzd *workload
	for _, w := range workloads(objs) {
		where := w.kind + " " + w.name
		sel, err := metav1.LabelSelectorAsSelector(w.selector)
		if err != nil || !sel.Matches(labels.Set(w.pod.Labels)) {
			bad("%s: its selector does not select its pods (%v)", where, err)
		}
		if strings.HasSuffix(w.name, "-authzd") {
			authzd = &w
		}
		ps := w.pod.Spec.SecurityContext
		if ps == nil || !deref(ps.RunAsNonRoot) || deref(ps.RunAsUser) == 0 {
			bad("%s: the pod does not run as a non-root uid", where)
		}
		if w.pod.Spec.AutomountServiceAccountToken == nil || *w.pod.Spec.AutomountServiceAccountToken {
			bad("%s: the pod mounts a service-account token it does not use", where)
		}
		volumes := map[string]corev1.Volume{}
		for _, v := range w.pod.Spec.Volumes {
			volumes[v.Name] = v
			if v.ConfigMap != nil && configMaps[v.ConfigMap.Name] == nil {
				bad("%s: volume %s names ConfigMap %s, which the chart does not render", where, v.Name, v.ConfigMap.Name)
			}
		}
		for _, c := range slices.Concat(w.pod.Spec.InitContainers, w.pod.Spec.Containers) {
			cw := where + " container " + c.Name
			sc := c.SecurityContext
			switch {
			case sc == nil:
				bad("%s: no securityContext", cw)
			case !deref(sc.ReadOnlyRootFilesystem):
				bad("%s: the root filesystem is writable", cw)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				bad("%s: may gain privileges", cw)
			case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
				bad("%s: does not drop every capability", cw)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				bad("%s: no cpu and memory requests", cw)
			}
			if c.Resources.Limits.Memory().IsZero() {
				bad("%s: no memory limit", cw)
			}
			for _, m := range c.VolumeMounts {
				if _, ok := volumes[m.Name]; !ok {
					if !slices.ContainsFunc(statefulSetClaims(objs, w.name), func(n string) bool { return n == m.Name }) {
						bad("%s: mounts %s, which the pod does not have", cw, m.Name)
					}
				}
			}
		}
	}
	if authzd == nil {
		return append(problems, "no authzd Deployment")
	}
	if authzd.kind != "Deployment" || authzd.replicas < 2 {
		bad("authzd: a %s of %d replicas, want a Deployment of at least 2", authzd.kind, authzd.replicas)
	}
	c := authzd.pod.Spec.Containers[0]
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
		bad("authzd: liveness is not /healthz")
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		bad("authzd: readiness is not /readyz")
	}
	podLabels := labels.Set(authzd.pod.Labels)
	if !slices.ContainsFunc(pdbs, func(p *policyv1.PodDisruptionBudget) bool {
		s, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		return err == nil && s.Matches(podLabels) && p.Spec.MinAvailable != nil && p.Spec.MinAvailable.IntValue() >= 1
	}) {
		bad("authzd: no PodDisruptionBudget keeps one of its pods")
	}
	if !slices.ContainsFunc(services, func(s *corev1.Service) bool {
		return len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels)
	}) {
		bad("authzd: no Service selects its pods")
	}
	for _, w := range workloads(objs) {
		for _, s := range services {
			if len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(w.pod.Labels)) {
				for _, port := range s.Spec.Ports {
					if port.TargetPort.StrVal != "" && !hasPort(w.pod.Spec.Containers, port.TargetPort.StrVal) {
						bad("Service %s: targetPort %s is no port of %s", s.Name, port.TargetPort.StrVal, w.name)
					}
				}
			}
		}
	}
	return append(problems, checkEtcd(objs, configMaps)...)
}

func hasPort(cs []corev1.Container, name string) bool {
	for _, c := range cs {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

func statefulSetClaims(objs []object, name string) []string {
	var names []string
	for _, o := range objs {
		if s, ok := o.obj.(*appsv1.StatefulSet); ok && o.name == name {
			for _, c := range s.Spec.VolumeClaimTemplates {
				names = append(names, c.Name)
			}
		}
	}
	return names
}

// authzdConfig is the authzd.yaml the chart renders, decoded.
type authzdConfig struct {
	EtcdEndpoints []string `json:"etcdEndpoints"`
	EtcdCA        string   `json:"etcdCA"`
}

// checkEtcd: with the bundled members, authzd's endpoints are exactly the
// StatefulSet's pods under its headless Service, and the members' initial
// cluster names each of them; with TLS to an external cluster, the files
// authzd.yaml names are in a mounted Secret.
func checkEtcd(objs []object, configMaps map[string]*corev1.ConfigMap) []string {
	var problems []string
	cm := configMaps["fcd-authzd"]
	if cm == nil {
		return []string{"no ConfigMap fcd-authzd with authzd.yaml"}
	}
	var cfg authzdConfig
	if err := yaml.Unmarshal([]byte(cm.Data["authzd.yaml"]), &cfg); err != nil {
		return []string{"authzd.yaml: " + err.Error()}
	}
	for _, o := range objs {
		s, ok := o.obj.(*appsv1.StatefulSet)
		if !ok {
			continue
		}
		var want, peers []string
		for i := range deref(s.Spec.Replicas) {
			pod := fmt.Sprintf("%s-%d", s.Name, i)
			want = append(want, fmt.Sprintf("http://%s.%s.fcd.svc:2379", pod, s.Spec.ServiceName))
			peers = append(peers, fmt.Sprintf("%s=http://%s.%s.fcd.svc:2380", pod, pod, s.Spec.ServiceName))
		}
		if !slices.Equal(cfg.EtcdEndpoints, want) {
			problems = append(problems, fmt.Sprintf("authzd's etcdEndpoints %q, want the members %q", cfg.EtcdEndpoints, want))
		}
		args := s.Spec.Template.Spec.Containers[0].Args
		if !slices.Contains(args, "--initial-cluster="+strings.Join(peers, ",")) {
			problems = append(problems, fmt.Sprintf("etcd's --initial-cluster is not %q: %q", strings.Join(peers, ","), args))
		}
		if !slices.ContainsFunc(objs, func(o object) bool {
			svc, ok := o.obj.(*corev1.Service)
			return ok && svc.Name == s.Spec.ServiceName && svc.Spec.ClusterIP == corev1.ClusterIPNone && svc.Spec.PublishNotReadyAddresses
		}) {
			problems = append(problems, "no headless Service "+s.Spec.ServiceName+" publishing the members before they are ready")
		}
	}
	if cfg.EtcdCA != "" {
		dir := path.Dir(cfg.EtcdCA)
		found := false
		for _, w := range workloads(objs) {
			if !strings.HasSuffix(w.name, "-authzd") {
				continue
			}
			for _, m := range w.pod.Spec.Containers[0].VolumeMounts {
				if m.MountPath == dir {
					found = slices.ContainsFunc(w.pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name && v.Secret != nil })
				}
			}
		}
		if !found {
			problems = append(problems, "etcdCA "+cfg.EtcdCA+" is in no Secret mounted into authzd")
		}
	}
	return problems
}

// TestChartRefuses: values the chart cannot deploy fail at rendering,
// naming what is missing.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct{ note, values, want string }{
		{"no trust secret", "authzd: {trust: {existingSecret: ''}}", "authzd.trust.existingSecret"},
		{"external without endpoints", "etcd: {mode: external}", "etcd.external.endpoints"},
		{"unknown etcd mode", "etcd: {mode: embedded}", "bundled or external"},
		{"example without digests", "example: {enabled: true}", "example.artifact"},
	} {
		t.Run(tc.note, func(t *testing.T) {
			_, err := render(t, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestChartChecksCatch: checkObjects finds a release that breaks a rule,
// made from the default one by one change.
func TestChartChecksCatch(t *testing.T) {
	for _, tc := range []struct {
		note   string
		change func(objs []object)
		want   string
	}{
		{"root pod", func(objs []object) { authzdPod(objs).SecurityContext.RunAsNonRoot = new(false) }, "non-root"},
		{"writable root", func(objs []object) {
			authzdPod(objs).Containers[0].SecurityContext.ReadOnlyRootFilesystem = new(false)
		}, "writable"},
		{"capability", func(objs []object) {
			authzdPod(objs).Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		}, "capability"},
		{"readiness on healthz", func(objs []object) { authzdPod(objs).Containers[0].ReadinessProbe.HTTPGet.Path = "/healthz" }, "readiness"},
		{"no requests", func(objs []object) { authzdPod(objs).Containers[0].Resources.Requests = nil }, "requests"},
		{"mount of nothing", func(objs []object) { authzdPod(objs).Volumes = authzdPod(objs).Volumes[1:] }, "mounts"},
	} {
		t.Run(tc.note, func(t *testing.T) {
			docs, err := render(t, "")
			if err != nil {
				t.Fatal(err)
			}
			objs := decodeStrictly(t, docs)
			tc.change(objs)
			problems := checkObjects(objs)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Fatalf("problems %q: want one naming %q", problems, tc.want)
			}
		})
	}
}

func authzdPod(objs []object) *corev1.PodSpec {
	for _, o := range objs {
		if d, ok := o.obj.(*appsv1.Deployment); ok && o.name == "fcd-authzd" {
			return &d.Spec.Template.Spec
		}
	}
	return nil
}

// commandLine is a command line the chart renders for authzd or
// fencecheck, made runnable here: serve's --config is the rendered
// authzd.yaml written to a temporary directory, keys new's --out a
// temporary directory, and serve and proxy run with --check.
type commandLine struct {
	where string // workload and container
	bin   string // authzd or fencecheck
	args  []string
}

func chartCommandLines(t *testing.T, values string) []commandLine {
	t.Helper()
	docs, err := render(t, values)
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeStrictly(t, docs)
	dir := t.TempDir()
	for _, o := range objs {
		if cm, ok := o.obj.(*corev1.ConfigMap); ok {
			for name, data := range cm.Data {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	var cls []commandLine
	for _, w := range workloads(objs) {
		for _, c := range slices.Concat(w.pod.Spec.InitContainers, w.pod.Spec.Containers) {
			if len(c.Command) == 0 {
				continue
			}
			cl := commandLine{where: w.name + " " + c.Name, bin: path.Base(c.Command[0]), args: slices.Clone(c.Args)}
			if cl.bin != "authzd" && cl.bin != "fencecheck" {
				continue
			}
			switch {
			case cl.bin == "authzd" && cl.args[0] == "serve":
				for i, a := range cl.args {
					if a == "--config" {
						cl.args[i+1] = filepath.Join(dir, path.Base(cl.args[i+1]))
					}
				}
				cl.args = append(cl.args, "--check")
			case cl.bin == "authzd" && cl.args[0] == "keys":
				for i, a := range cl.args {
					if a == "--out" {
						cl.args[i+1] = filepath.Join(dir, "signing")
					}
				}
			case cl.bin == "fencecheck" && cl.args[0] == "proxy":
				cl.args = append(cl.args, "--check")
			default:
				t.Errorf("%s: %s %q, which the test does not know", cl.where, cl.bin, cl.args)
				continue
			}
			cls = append(cls, cl)
		}
	}
	return cls
}

// TestChartCommandLines runs every authzd and fencecheck command line
// the chart renders through the real binaries (built as the image builds
// them): authzd serve and fencecheck proxy with --check, with the
// rendered authzd.yaml as the --config file, and the init container's
// keys new twice (the second run, as after a restart of the pod, keeps
// the key).
func TestChartCommandLines(t *testing.T) {
	bin := binaries(t)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			cls := chartCommandLines(t, vs.values)
			for _, cl := range cls {
				out, err := exec.Command(filepath.Join(bin, cl.bin), cl.args...).CombinedOutput()
				if err != nil {
					t.Errorf("%s: %s %q: %v\n%s", cl.where, cl.bin, cl.args, err, out)
				}
				if cl.args[0] == "keys" {
					if out, err := exec.Command(filepath.Join(bin, cl.bin), cl.args...).CombinedOutput(); err != nil {
						t.Errorf("%s: %s %q again: %v\n%s", cl.where, cl.bin, cl.args, err, out)
					}
				}
			}
			want := 2 // the signing key, authzd
			if strings.Contains(vs.values, "\nexample:") {
				want++ // the sidecar
			}
			if len(cls) != want {
				t.Errorf("ran %d command lines, want %d", len(cls), want)
			}
		})
	}
}

// TestChartCommandLinesCatch: a command line the binaries refuse fails
// TestChartCommandLines's run — a misspelt authzd setting, a sidecar
// flag out of range.
func TestChartCommandLinesCatch(t *testing.T) {
	bin := binaries(t)
	for _, tc := range []struct{ note, values, bin, want string }{
		{"misspelt setting", "authzd: {settings: {tokenLifetyme: 1m}}", "authzd", "tokenLifetime"},
		{"negative generation", "example: {enabled: true, artifact: sha256:a, config: sha256:c, generation: -1}", "fencecheck", "--generation"},
	} {
		t.Run(tc.note, func(t *testing.T) {
			failed := false
			for _, cl := range chartCommandLines(t, tc.values) {
				out, err := exec.Command(filepath.Join(bin, cl.bin), cl.args...).CombinedOutput()
				if err != nil {
					failed = true
					if cl.bin != tc.bin || !strings.Contains(string(out), tc.want) {
						t.Errorf("%s failed: %s, want %s naming %q", cl.where, out, tc.bin, tc.want)
					}
				}
			}
			if !failed {
				t.Fatal("every command line passed")
			}
		})
	}
}
