package main

// The DRA half of the hollow node's container manager: the kubelet's real DRA
// manager (pkg/kubelet/cm/dra) behind the container manager's dynamic resource
// methods, wired the way pkg/kubelet/cm/container_manager_linux.go wires it:
// created when the DynamicResourceAllocation gate is on, its state
// (dra_manager_state, dra_health_state) in the kubelet root directory, DRA
// plugins registered through the plugin watcher (<root-dir>/plugins_registry),
// NodePrepareResources before the pod sandbox, the claims' CDI devices in the
// containers' runtime options, NodeUnprepareResources once the pod is gone,
// and the claims in the PodResources API.

import (
	"context"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	kubefeatures "k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/metrics"
)

// newDRAManager is the kubelet's DRA manager with its state in rootDir (as
// the kubelet's, which keeps it in its root directory), or nil when the
// DynamicResourceAllocation gate is off. The client reads ResourceClaims and
// wipes the node's ResourceSlices of drivers that are gone.
func newDRAManager(client clientset.Interface, rootDir string) (*dra.Manager, error) {
	if !utilfeature.DefaultFeatureGate.Enabled(kubefeatures.DynamicResourceAllocation) {
		return nil, nil
	}
	klog.InfoS("Creating Dynamic Resource Allocation (DRA) manager", "stateDir", rootDir)
	m, err := dra.NewManager(klog.TODO(), client, rootDir)
	if err != nil {
		return nil, err
	}
	metrics.RegisterCollectors(m.NewMetricsCollector())
	return m, nil
}

// draHealth: the DRA manager's health updates reach the kubelet (and the pod
// status) only with ResourceHealthStatus, as in the real container manager.
func (c *deviceContainerManager) draHealth() bool {
	return c.dra != nil && utilfeature.DefaultFeatureGate.Enabled(kubefeatures.ResourceHealthStatus)
}

func (c *deviceContainerManager) startDRA(ctx context.Context, activePods cm.ActivePodsFunc,
	getNode cm.GetNodeFunc, sourcesReady config.SourcesReady) error {
	if c.dra == nil {
		return nil
	}
	return c.dra.Start(ctx, dra.ActivePodsFunc(activePods), dra.GetNodeFunc(getNode), sourcesReady)
}

func (c *deviceContainerManager) PrepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	if c.dra == nil {
		return nil
	}
	return c.dra.PrepareResources(ctx, pod)
}

func (c *deviceContainerManager) UnprepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	if c.dra == nil {
		return nil
	}
	return c.dra.UnprepareResources(ctx, pod)
}

func (c *deviceContainerManager) PodMightNeedToUnprepareResources(uid types.UID) bool {
	return c.dra != nil && c.dra.PodMightNeedToUnprepareResources(uid)
}

// dynamicResources is the real container manager's GetDynamicResources, as it
// is: one entry per claim of the container, one ClaimResource per
// prepared device. Upstream collects the CDI IDs per driver, not per device,
// so a device's entry also lists the CDI IDs of the driver's devices before
// it; kept, since the PodResources API is what a real kubelet answers.
func (c *deviceContainerManager) dynamicResources(pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	if c.dra == nil {
		return []*podresourcesapi.DynamicResource{}
	}
	claimInfos, err := c.dra.GetContainerClaimInfos(pod, container)
	if err != nil {
		klog.ErrorS(err, "Unable to get container claim info state")
		return []*podresourcesapi.DynamicResource{}
	}
	var out []*podresourcesapi.DynamicResource
	for _, claimInfo := range claimInfos {
		var claimResources []*podresourcesapi.ClaimResource
		for driverName, driverState := range claimInfo.DriverState {
			var cdiDevices []*podresourcesapi.CDIDevice
			for _, device := range driverState.Devices {
				for _, id := range device.CDIDeviceIDs {
					cdiDevices = append(cdiDevices, &podresourcesapi.CDIDevice{Name: id})
				}
				claimResources = append(claimResources, &podresourcesapi.ClaimResource{
					CdiDevices: cdiDevices,
					DriverName: driverName,
					PoolName:   device.PoolName,
					DeviceName: device.DeviceName,
				})
			}
		}
		out = append(out, &podresourcesapi.DynamicResource{
			ClaimName:      claimInfo.ClaimName,
			ClaimNamespace: claimInfo.Namespace,
			ClaimResources: claimResources,
		})
	}
	return out
}

// mergeUpdates fans the sources' resource updates into one channel, closed
// when all of them are.
func mergeUpdates(sources ...<-chan resourceupdates.Update) <-chan resourceupdates.Update {
	out := make(chan resourceupdates.Update, 10)
	var wg sync.WaitGroup
	for _, src := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range src {
				out <- u
			}
		}()
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return out
}
