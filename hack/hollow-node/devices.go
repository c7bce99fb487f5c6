package main

// The device half of the hollow node's container manager: kubemark's stub
// container manager with the device plugin methods handed to the kubelet's
// real device manager, wired the way pkg/kubelet/cm/container_manager_linux.go
// wires it (a topology manager with policy "none" whose pod admit handler
// calls the device manager's Allocate for every init container, then every
// app container). The DRA methods are in dra.go, the methods whose signatures
// follow the Kubernetes minor in kubelet_1_<minor>.go.

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apiserver/pkg/server/healthz"
	internalapi "k8s.io/cri-api/pkg/apis"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/kubernetes/pkg/kubelet/status"
	schedulerframework "k8s.io/kubernetes/pkg/scheduler/framework"
)

// deviceContainerManager is kubemark's stub container manager (no cgroups, no
// CPU or memory manager) with the real device manager behind every method
// that concerns device plugin resources, and the real DRA manager (nil when
// the DynamicResourceAllocation gate is off) behind every method that
// concerns dynamic resources.
type deviceContainerManager struct {
	cm.ContainerManager
	devices  *devicemanager.ManagerImpl
	topology topologymanager.Manager
	dra      *dra.Manager
	updates  <-chan resourceupdates.Update
}

func newDeviceContainerManager(socketPath string, draManager *dra.Manager) (*deviceContainerManager, error) {
	devices, topology, err := newDeviceManager(socketPath)
	if err != nil {
		return nil, err
	}
	c := &deviceContainerManager{
		ContainerManager: cm.NewStubContainerManager(),
		devices:          devices,
		topology:         topology,
		dra:              draManager,
		updates:          devices.Updates(),
	}
	if c.draHealth() {
		c.updates = mergeUpdates(devices.Updates(), draManager.Updates())
	}
	return c, nil
}

var _ cm.ContainerManager = &deviceContainerManager{}

func (c *deviceContainerManager) Start(ctx context.Context, node *v1.Node, activePods cm.ActivePodsFunc,
	getNode cm.GetNodeFunc, sourcesReady config.SourcesReady, podStatusProvider status.PodStatusProvider,
	runtimeService internalapi.RuntimeService, localStorageCapacityIsolation bool) error {
	if err := c.ContainerManager.Start(ctx, node, activePods, getNode, sourcesReady, podStatusProvider,
		runtimeService, localStorageCapacityIsolation); err != nil {
		return err
	}
	if err := c.startDRA(ctx, activePods, getNode, sourcesReady); err != nil {
		return fmt.Errorf("start dra manager error: %w", err)
	}
	// The device manager starts with no containers: the real container
	// manager seeds it from the runtime's (buildContainerMapAndRunningSetFromRuntime),
	// and the fake runtime starts empty every time, so after a restart no
	// container is running and the device manager re-allocates from its
	// checkpoint, as the kubelet does after a runtime restart.
	return c.startDevices(ctx, devicemanager.ActivePodsFunc(activePods), sourcesReady)
}

// GetPluginRegistrationHandlers: device plugins may also register through the
// plugin watcher (<root-dir>/plugins_registry), as on a real kubelet; DRA
// plugins register there (type DRAPlugin).
func (c *deviceContainerManager) GetPluginRegistrationHandlers() map[string]cache.PluginHandler {
	handlers := map[string]cache.PluginHandler{pluginwatcherapi.DevicePlugin: c.devices.GetWatcherHandler()}
	if c.dra != nil {
		handlers[pluginwatcherapi.DRAPlugin] = c.dra.GetWatcherHandler()
	}
	return handlers
}

func (c *deviceContainerManager) GetHealthCheckers() []healthz.HealthChecker {
	return []healthz.HealthChecker{c.devices.GetHealthChecker()}
}

func (c *deviceContainerManager) UpdatePluginResources(node *schedulerframework.NodeInfo, attrs *lifecycle.PodAdmitAttributes) error {
	return c.devices.UpdatePluginResources(node, attrs)
}

// GetResources returns the CDI devices of the container's prepared claims,
// then the device runtime options (envs, mounts, device nodes, annotations,
// CDI devices) of the container's allocation; this is where the kubelet calls
// PreStartContainer when a plugin asks for it.
func (c *deviceContainerManager) GetResources(ctx context.Context, pod *v1.Pod, container *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	opts := &kubecontainer.RunContainerOptions{}
	if c.dra != nil {
		resOpts, err := c.dra.GetResources(pod, container)
		if err != nil {
			return nil, err
		}
		opts.CDIDevices = append(opts.CDIDevices, resOpts.CDIDevices...)
	}
	devOpts, err := c.deviceRunContainerOptions(ctx, pod, container)
	if err != nil || devOpts == nil {
		return opts, err
	}
	opts.Devices = append(opts.Devices, devOpts.Devices...)
	opts.Mounts = append(opts.Mounts, devOpts.Mounts...)
	opts.Envs = append(opts.Envs, devOpts.Envs...)
	opts.Annotations = append(opts.Annotations, devOpts.Annotations...)
	opts.CDIDevices = append(opts.CDIDevices, devOpts.CDIDevices...)
	return opts, nil
}

func (c *deviceContainerManager) ShouldResetExtendedResourceCapacity() bool {
	return c.devices.ShouldResetExtendedResourceCapacity()
}

func (c *deviceContainerManager) Updates() <-chan resourceupdates.Update {
	return c.updates
}

// The PodResources API (served by the kubelet on
// <root-dir>/pod-resources/kubelet.sock) reads devices from these.

func (c *deviceContainerManager) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return containerDevices(c.devices.GetDevices(podUID, containerName))
}

// containerDevices is cm.containerDevicesFromResourceDeviceInstances
// (unexported upstream): one entry per device and NUMA node.
func containerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resourceName, resourceDevs := range devs {
		for devID, dev := range resourceDevs {
			topo := dev.GetTopology()
			if topo == nil {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{devID}})
				continue
			}
			for _, node := range topo.GetNodes() {
				out = append(out, &podresourcesapi.ContainerDevices{
					ResourceName: resourceName,
					DeviceIds:    []string{devID},
					Topology:     &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: node.GetID()}}},
				})
			}
		}
	}
	return out
}
