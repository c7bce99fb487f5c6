//go:build k8s_1_37

package main

// The glue that follows Kubernetes 1.37's kubelet internals (hack/k8s-tools.sh
// builds with -tags k8s_1_37 for a 1.37 release): the constructors and the
// container manager methods whose signatures changed in 1.35-1.37 (a logger or
// context argument). kubelet_1_34.go holds 1.34's.

import (
	"context"
	"time"
	_ "unsafe" // for go:linkname

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"go.opentelemetry.io/otel/trace/noop"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	internalapi "k8s.io/cri-api/pkg/apis"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// newManagerImpl is devicemanager.newManagerImpl. The exported
// NewManagerImpl always listens on /var/lib/kubelet/device-plugins/kubelet.sock;
// the unexported constructor (which upstream's own tests call) takes the
// socket path, so each hollow node gets its own plugin directory (and its own
// checkpoint, kept next to the socket). Go 1.23+ refuses such "pull"
// linknames unless the binary is linked with -ldflags=-checklinkname=0
// (hack/k8s-tools.sh does). The signature must match this minor's.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

// newDeviceManager is the device manager on socketPath behind a topology
// manager with policy "none": NewManager ignores the topology and scope and
// builds the none scope, whose Admit calls each hint provider's Allocate for
// append(pod.Spec.InitContainers, pod.Spec.Containers...) and turns an error
// into an UnexpectedAdmissionError rejection.
func newDeviceManager(socketPath string) (*devicemanager.ManagerImpl, topologymanager.Manager, error) {
	logger := klog.Background()
	topology, err := topologymanager.NewManager(logger, nil, topologymanager.PolicyNone, "container", nil)
	if err != nil {
		return nil, nil, err
	}
	devices, err := newManagerImpl(logger, socketPath, nil, topology)
	if err != nil {
		return nil, nil, err
	}
	topology.AddHintProvider(logger, devices)
	return devices, topology, nil
}

func (m *machine) MachineInfo(logger klog.Logger) (*cadvisorapi.MachineInfo, error) {
	info, err := m.Fake.MachineInfo(logger)
	if err != nil {
		return nil, err
	}
	info.NumCores = m.cpus
	info.MemoryCapacity = m.memory
	return info, nil
}

// newRuntimeService is the kubelet's CRI client of the fake runtime on endpoint.
func newRuntimeService(ctx context.Context, endpoint string) (internalapi.RuntimeService, error) {
	return remote.NewRemoteRuntimeServiceBuilder().
		WithEndpoint(endpoint).
		WithConnectionTimeout(15 * time.Second).
		WithTracerProvider(noop.NewTracerProvider()).
		Build(ctx)
}

func (c *deviceContainerManager) startDevices(ctx context.Context, activePods devicemanager.ActivePodsFunc, sourcesReady config.SourcesReady) error {
	return c.devices.Start(klog.FromContext(ctx), activePods, sourcesReady, containermap.NewContainerMap(), sets.New[string]())
}

func (c *deviceContainerManager) deviceRunContainerOptions(ctx context.Context, pod *v1.Pod, container *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return c.devices.GetDeviceRunContainerOptions(ctx, pod, container)
}

func (c *deviceContainerManager) GetDevicePluginResourceCapacity(logger klog.Logger) (v1.ResourceList, v1.ResourceList, []string) {
	return c.devices.GetCapacity(logger)
}

func (c *deviceContainerManager) GetAllocateResourcesPodAdmitHandler(_ klog.Logger) lifecycle.PodAdmitHandler {
	return c.topology
}

func (c *deviceContainerManager) UpdateAllocatedResourcesStatus(logger klog.Logger, pod *v1.Pod, status *v1.PodStatus) {
	c.devices.UpdateAllocatedResourcesStatus(logger, pod, status)
	if c.draHealth() {
		c.dra.UpdateAllocatedResourcesStatus(logger, pod, status)
	}
}

func (c *deviceContainerManager) GetAllocatableDevices(logger klog.Logger) []*podresourcesapi.ContainerDevices {
	return containerDevices(c.devices.GetAllocatableDevices(logger))
}

func (c *deviceContainerManager) UpdateAllocatedDevices(logger klog.Logger) {
	c.devices.UpdateAllocatedDevices(logger)
}

func (c *deviceContainerManager) GetDynamicResources(_ klog.Logger, pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	return c.dynamicResources(pod, container)
}
