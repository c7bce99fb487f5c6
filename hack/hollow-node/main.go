// lj-hollow-node: a node agent that runs the real kubelet's code (as
// kubemark's hollow kubelet does: pkg/kubemark, cmd/kubemark/app) with an
// in-process fake CRI runtime, and the kubelet's real device manager instead
// of kubemark's stub, so that a device plugin can be tested against the real
// kubelet: registration on its own plugin directory, ListAndWatch into the
// Node's capacity, Allocate at pod admission (init containers first, device
// reuse), PreStartContainer, the checkpoint, and the PodResources API. And the
// kubelet's real DRA manager (dra.go), so that a DRA kubelet plugin can be
// tested the same way: registration through <root-dir>/plugins_registry,
// NodePrepareResources before the pod's sandbox, the claims' CDI devices in
// CreateContainer (written down by cdi.go), NodeUnprepareResources, the DRA
// checkpoint, and the claims in the PodResources API.
//
// A test tool: no cgroups, no CPU or memory manager, containers "run" at
// once in the fake runtime (and forever, unless --exec-command-prefix makes
// them local processes: exec.go). Built by hack/k8s-tools.sh against a pinned
// k8s.io/kubernetes with the build tag of its minor (k8s_1_34, k8s_1_37: the
// kubelet internals whose signatures differ between them are in
// kubelet_1_34.go and kubelet_1_37.go); started by
// lj_runtimekit.envtest.hollownode.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	typedv1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	"k8s.io/component-base/version"
	"k8s.io/component-base/version/verflag"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubemark"
)

type options struct {
	kubeconfig   string
	nodeName     string
	address      string
	port         int
	readOnlyPort int
	rootDir      string
	pluginDir    string
	nodeLabels   map[string]string
	maxPods      int
	cpus         int
	memoryGiB    int
	execPrefix   string
	execPathMap  map[string]string
	featureGates map[string]bool
}

// machine is cadvisor's fake machine with the node size of the flags: the fake
// alone reports 1 CPU and 3.75 GiB, which ten pods requesting 100m fill
// (OutOfcpu), far below a GPU node. Its MachineInfo is in kubelet_1_<minor>.go.
type machine struct {
	cadvisortest.Fake
	cpus   int
	memory uint64
}

// --die-with-parent: SIGKILL when the process (thread) that started us exits,
// so a killed test run leaves no node behind. Set here rather than by the
// launcher between fork and exec, which is unsafe in a process running gRPC
// threads (a test's device plugin). In init: the main goroutine is still on
// the main thread, whose parent-death signal counts.
func init() {
	if slices.Contains(os.Args[1:], "--die-with-parent") {
		_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0)
		if errno != 0 || os.Getppid() == 1 { // failed, or the parent is already gone
			os.Exit(1)
		}
	}
}

func main() {
	o := options{nodeLabels: map[string]string{}, execPathMap: map[string]string{}, featureGates: map[string]bool{}}
	var dieWithParent bool
	fs := pflag.NewFlagSet("lj-hollow-node", pflag.ExitOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server (the node registers itself with it)")
	fs.StringVar(&o.nodeName, "node-name", "hollow-node", "name of the Node")
	fs.StringVar(&o.address, "address", "127.0.0.1", "IP the kubelet server and read-only port listen on (one loopback address per node: 127.0.0.2, 127.0.0.3, ...)")
	fs.IntVar(&o.port, "port", 10250, "kubelet server port (plain HTTP, no authentication: a test tool)")
	fs.IntVar(&o.readOnlyPort, "read-only-port", 10255, "kubelet read-only port (/pods, /healthz); 0 turns it off")
	fs.StringVar(&o.rootDir, "root-dir", "", "kubelet root directory (pods, plugins_registry, pod-resources/kubelet.sock); required")
	fs.StringVar(&o.pluginDir, "plugin-dir", "", "device plugin directory holding the registration socket kubelet.sock and the device manager checkpoint (default <root-dir>/device-plugins)")
	fs.Var(cliflag.NewMapStringString(&o.nodeLabels), "node-labels", "labels the Node registers with (key=value,...)")
	fs.IntVar(&o.maxPods, "max-pods", 110, "pods the node admits at most")
	fs.IntVar(&o.cpus, "cpus", 64, "CPUs the node reports (capacity)")
	fs.IntVar(&o.memoryGiB, "memory-gib", 512, "memory the node reports (capacity), GiB")
	fs.StringVar(&o.execPrefix, "exec-command-prefix", "", "containers whose command[0] starts with this are run as local processes (environment from the pod spec and the device plugin's Allocate), their exit code ends the container; logs in <root-dir>/exec-logs. Others run forever in the fake runtime. Empty: none")
	fs.Var(cliflag.NewMapStringString(&o.execPathMap), "exec-path-map", "for containers run by --exec-command-prefix: HOST=LOCAL,... replaces the prefix HOST of every argument and environment value by LOCAL (a pod's hostPath, e.g. the Runtime socket directory, onto this node's directory)")
	fs.Var(cliflag.NewMapStringBool(&o.featureGates), "feature-gates", "kubelet feature gates (A=true,B=false,...), as the kubelet's --feature-gates; match the control plane's (the DRA manager needs DynamicResourceAllocation, on by default)")
	fs.BoolVar(&dieWithParent, "die-with-parent", false, "exit (SIGKILL) when the parent process exits (Linux; exactly this spelling)")
	verflag.AddFlags(fs)
	logs.AddFlags(fs) // -v, --vmodule, ...
	_ = fs.Parse(os.Args[1:])
	verflag.PrintAndExitIfRequested() // --version: "Kubernetes v1.34.4" (stamped at build time)

	if err := run(context.Background(), &o); err != nil {
		fmt.Fprintf(os.Stderr, "lj-hollow-node: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options) error {
	if o.kubeconfig == "" || o.rootDir == "" {
		return fmt.Errorf("--kubeconfig and --root-dir are required")
	}
	if net.ParseIP(o.address) == nil {
		return fmt.Errorf("--address %q is not an IP address", o.address)
	}
	rootDir, err := filepath.Abs(o.rootDir)
	if err != nil {
		return err
	}
	pluginDir := o.pluginDir
	if pluginDir == "" {
		pluginDir = filepath.Join(rootDir, "device-plugins")
	}
	if pluginDir, err = filepath.Abs(pluginDir); err != nil {
		return err
	}
	// As the kubelet: the gates go to the process's registry (read by the
	// kubelet's code) and to its configuration.
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(o.featureGates); err != nil {
		return fmt.Errorf("--feature-gates: %w", err)
	}
	klog.InfoS("Starting lj-hollow-node", "version", version.Get().GitVersion, "node", o.nodeName,
		"address", o.address, "rootDir", rootDir, "pluginDir", pluginDir,
		"podResourcesSocket", filepath.Join(rootDir, "pod-resources", "kubelet.sock"))

	restConfig, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", o.kubeconfig, err)
	}
	restConfig.UserAgent = "lj-hollow-node"
	restConfig.QPS, restConfig.Burst = 50, 100
	client, err := clientset.NewForConfig(restConfig)
	if err != nil {
		return err
	}

	// kubemark's configuration (GetHollowKubeletConfig), with our directories
	// and ports. It makes a temporary root directory of its own; drop it.
	f, c := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName:            o.nodeName,
		KubeletPort:         o.port,
		KubeletReadOnlyPort: o.readOnlyPort,
		MaxPods:             o.maxPods,
		NodeLabels:          o.nodeLabels,
	})
	_ = os.RemoveAll(f.RootDirectory)
	f.RootDirectory = rootDir
	c.Address = o.address
	c.StaticPodPath = filepath.Join(rootDir, "static-pods")
	c.PodLogsDir = filepath.Join(rootDir, "pod-logs")
	c.NodeStatusUpdateFrequency.Duration = 2 * time.Second // quicker capacity updates than kubemark's 10s
	c.SyncFrequency.Duration = 5 * time.Second
	c.FeatureGates = o.featureGates
	for _, d := range []string{c.StaticPodPath, c.PodLogsDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}

	// As cmd/kubemark/app: heartbeats on their own client with a timeout.
	heartbeatConfig := *restConfig
	heartbeatConfig.Timeout = c.NodeStatusUpdateFrequency.Duration
	if lease := time.Duration(c.NodeLeaseDurationSeconds) * time.Second; heartbeatConfig.Timeout > lease {
		heartbeatConfig.Timeout = lease
	}
	heartbeatConfig.QPS = -1
	heartbeatClient, err := clientset.NewForConfig(&heartbeatConfig)
	if err != nil {
		return err
	}

	draManager, err := newDRAManager(client, rootDir)
	if err != nil {
		return fmt.Errorf("dra manager: %w", err)
	}
	containerManager, err := newDeviceContainerManager(filepath.Join(pluginDir, "kubelet.sock"), draManager)
	if err != nil {
		return fmt.Errorf("device manager: %w", err)
	}

	// The fake CRI runtime and image service, in process, on a socket of
	// their own under the root directory (not in /tmp: one per node).
	endpoint := "unix://" + filepath.Join(rootDir, "fake-cri.sock")
	_ = os.Remove(filepath.Join(rootDir, "fake-cri.sock"))
	fakeRuntime := fakeremote.NewFakeRemoteRuntime()
	if err := fakeRuntime.Start(endpoint); err != nil {
		return fmt.Errorf("fake runtime: %w", err)
	}
	defer fakeRuntime.Stop()
	// The fakes record every call they get (for unit tests' asserts); the
	// kubelet polls the runtime each second, so drop the record now and then.
	go func() {
		for range time.Tick(time.Minute) {
			fakeRuntime.RuntimeService.Lock()
			fakeRuntime.RuntimeService.Called = nil
			fakeRuntime.RuntimeService.Unlock()
			fakeRuntime.ImageService.Lock()
			fakeRuntime.ImageService.Called = nil
			fakeRuntime.ImageService.Unlock()
		}
	}()
	runtimeService, err := newRuntimeService(ctx, endpoint)
	if err != nil {
		return fmt.Errorf("runtime service: %w", err)
	}
	if o.execPrefix != "" {
		logDir := filepath.Join(rootDir, "exec-logs")
		if err := os.MkdirAll(logDir, 0o750); err != nil {
			return err
		}
		runtimeService = newExecRuntime(runtimeService, fakeRuntime.RuntimeService, o.execPrefix, logDir, o.execPathMap)
	}
	if runtimeService, err = newCDIRecorder(runtimeService, filepath.Join(rootDir, "cdi-devices")); err != nil {
		return err
	}

	hollow := kubemark.NewHollowKubelet(f, c, client, heartbeatClient,
		&machine{Fake: cadvisortest.Fake{NodeName: o.nodeName}, cpus: o.cpus, memory: uint64(o.memoryGiB) << 30},
		fakeRuntime.ImageService, runtimeService, containerManager,
	)
	// kubemark drops events (a fake recorder); the kubelet's events are part of what
	// is tested here (an admission failure is an UnexpectedAdmissionError event on the
	// pod), so they go to the API server as the kubelet's do.
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedv1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	hollow.KubeletDeps.Recorder = broadcaster.NewRecorder(
		legacyscheme.Scheme, v1.EventSource{Component: "kubelet", Host: o.nodeName})
	hollow.Run(ctx) // blocks
	return nil
}
