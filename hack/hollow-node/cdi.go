package main

// What the kubelet passes to the runtime as a container's CDI devices: the
// fake runtime ignores them, so each CreateContainer's are written down, one
// JSON file per container, <dir>/<pod uid>_<container name>.json (replaced when
// the container is created again): the pod, the container, the CDI device
// names of the config's CDIDevices (DRA claims, device plugins' CDI devices)
// and the config's CDI annotations (cdi.k8s.io/...).

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// cdiRecord is one container's file.
type cdiRecord struct {
	PodUID         string            `json:"podUID"`
	PodNamespace   string            `json:"podNamespace"`
	PodName        string            `json:"podName"`
	ContainerName  string            `json:"containerName"`
	CDIDevices     []string          `json:"cdiDevices"`
	CDIAnnotations map[string]string `json:"cdiAnnotations"`
}

// cdiRecorder is a CRI client that writes down each created container's CDI
// devices in dir.
type cdiRecorder struct {
	internalapi.RuntimeService
	dir string
}

func newCDIRecorder(client internalapi.RuntimeService, dir string) (*cdiRecorder, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	return &cdiRecorder{RuntimeService: client, dir: dir}, nil
}

func (r *cdiRecorder) CreateContainer(ctx context.Context, podSandboxID string, config *runtimeapi.ContainerConfig, sandboxConfig *runtimeapi.PodSandboxConfig) (string, error) {
	rec := cdiRecord{
		PodUID:         sandboxConfig.GetMetadata().GetUid(),
		PodNamespace:   sandboxConfig.GetMetadata().GetNamespace(),
		PodName:        sandboxConfig.GetMetadata().GetName(),
		ContainerName:  config.GetMetadata().GetName(),
		CDIDevices:     []string{},
		CDIAnnotations: map[string]string{},
	}
	for _, d := range config.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	for k, v := range config.GetAnnotations() {
		if strings.HasPrefix(k, "cdi.k8s.io/") {
			rec.CDIAnnotations[k] = v
		}
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	// Written before the container exists, through a rename: a reader sees
	// the whole file or none.
	path := filepath.Join(r.dir, rec.PodUID+"_"+rec.ContainerName+".json")
	if err := os.WriteFile(path+".tmp", data, 0o640); err != nil {
		return "", err
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return "", err
	}
	return r.RuntimeService.CreateContainer(ctx, podSandboxID, config, sandboxConfig)
}
