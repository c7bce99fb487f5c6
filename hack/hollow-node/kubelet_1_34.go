//go:build k8s_1_34

package main

// The glue that follows Kubernetes 1.34's kubelet internals (hack/k8s-tools.sh
// builds with -tags k8s_1_34 for a 1.34 release): the constructors and the
// container manager methods whose signatures changed after it (a logger or
// context argument). kubelet_1_37.go holds 1.37's.

import (
	"context"
	"time"
	_ "unsafe" // for go:linkname

	cadvisorapi "github.com/google/cadvisor/info/v1"
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
func newManagerImpl(socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

// newDeviceManager is the device manager on socketPath behind a topology
// manager with policy "none": NewManager ignores the topology and scope and
// builds the none scope, whose Admit calls each hint provider's Allocate for
// append(pod.Spec.InitContainers, pod.Spec.Containers...) and turns an error
// into an UnexpectedAdmissionError rejection.
func newDeviceManager(socketPath string) (*devicemanager.ManagerImpl, topologymanager.Manager, error) {
	topology, err := topologymanager.NewManager(nil, topologymanager.PolicyNone, "container", nil)
	if err != nil {
		return nil, nil, err
	}
	devices, err := newManagerImpl(socketPath, nil, topology)
	if err != nil {
		return nil, nil, err
	}
	topology.AddHintProvider(devices)
	return devices, topology, nil
}

func (m *machine) MachineInfo() (*cadvisorapi.MachineInfo, error) {
	info, err := m.Fake.MachineInfo()
	if err != nil {
		return nil, err
	}
	info.NumCores = m.cpus
	info.MemoryCapacity = m.memory
	return info, nil
}

// newRuntimeService is the kubelet's CRI client of the fake runtime on endpoint.
func newRuntimeService(_ context.Context, endpoint string) (internalapi.RuntimeService, error) {
	logger := klog.Background()
	return remote.NewRemoteRuntimeService(endpoint, 15*time.Second, noop.NewTracerProvider(), &logger)
}

func (c *deviceContainerManager) startDevices(_ context.Context, activePods devicemanager.ActivePodsFunc, sourcesReady config.SourcesReady) error {
	return c.devices.Start(activePods, sourcesReady, containermap.NewContainerMap(), sets.New[string]())
}

func (c *deviceContainerManager) deviceRunContainerOptions(_ context.Context, pod *v1.Pod, container *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return c.devices.GetDeviceRunContainerOptions(pod, container)
}

func (c *deviceContainerManager) GetDevicePluginResourceCapacity() (v1.ResourceList, v1.ResourceList, []string) {
	return c.devices.GetCapacity()
}

func (c *deviceContainerManager) GetAllocateResourcesPodAdmitHandler() lifecycle.PodAdmitHandler {
	return c.topology
}

func (c *deviceContainerManager) UpdateAllocatedResourcesStatus(pod *v1.Pod, status *v1.PodStatus) {
	c.devices.UpdateAllocatedResourcesStatus(pod, status)
	if c.draHealth() {
		c.dra.UpdateAllocatedResourcesStatus(pod, status)
	}
}

func (c *deviceContainerManager) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	return containerDevices(c.devices.GetAllocatableDevices())
}

func (c *deviceContainerManager) UpdateAllocatedDevices() {
	c.devices.UpdateAllocatedDevices()
}

func (c *deviceContainerManager) GetDynamicResources(pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	return c.dynamicResources(pod, container)
}
