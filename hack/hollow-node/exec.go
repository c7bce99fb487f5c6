package main

// --exec-command-prefix: containers whose command[0] starts with the prefix
// are really run, as local processes, and their exit decides the container's
// fate. Every other container "runs" forever in the fake runtime, as in
// kubemark (so an init container would never finish: give it such a command).

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	"k8s.io/klog/v2"
)

// execRuntime is the CRI client of the fake runtime; containers that match
// the prefix get a local process started with StartContainer (command, args,
// working directory and the container's environment, device plugin Allocate
// envs included) and marked exited in the fake runtime when it ends.
type execRuntime struct {
	internalapi.RuntimeService
	fake   *apitest.FakeRuntimeService // the state behind the CRI server
	prefix string
	logDir string
	paths  map[string]string // host path prefix -> this node's directory

	mu      sync.Mutex
	configs map[string]*runtimeapi.ContainerConfig
	procs   map[string]*os.Process
}

func newExecRuntime(client internalapi.RuntimeService, fake *apitest.FakeRuntimeService, prefix, logDir string, paths map[string]string) *execRuntime {
	return &execRuntime{RuntimeService: client, fake: fake, prefix: prefix, logDir: logDir, paths: paths,
		configs: map[string]*runtimeapi.ContainerConfig{}, procs: map[string]*os.Process{}}
}

// mapPath replaces a host path prefix (--exec-path-map) inside one argument or
// value: "--socket-dir=/run/x/" becomes "--socket-dir=<node dir>/".
func (r *execRuntime) mapPath(s string) string {
	for host, local := range r.paths {
		if i := strings.Index(s, host); i >= 0 {
			return s[:i] + local + s[i+len(host):]
		}
	}
	return s
}

func (r *execRuntime) CreateContainer(ctx context.Context, podSandboxID string, config *runtimeapi.ContainerConfig, sandboxConfig *runtimeapi.PodSandboxConfig) (string, error) {
	id, err := r.RuntimeService.CreateContainer(ctx, podSandboxID, config, sandboxConfig)
	if err == nil && len(config.Command) > 0 && strings.HasPrefix(config.Command[0], r.prefix) {
		r.mu.Lock()
		r.configs[id] = config
		r.mu.Unlock()
	}
	return id, err
}

func (r *execRuntime) StartContainer(ctx context.Context, id string) error {
	if err := r.RuntimeService.StartContainer(ctx, id); err != nil {
		return err
	}
	r.mu.Lock()
	config := r.configs[id]
	delete(r.configs, id)
	r.mu.Unlock()
	if config == nil {
		return nil
	}
	argv := append(append([]string{}, config.Command...), config.Args...)
	for i := range argv {
		argv[i] = r.mapPath(argv[i])
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = config.WorkingDir
	cmd.Env = os.Environ()
	for _, kv := range config.Envs {
		cmd.Env = append(cmd.Env, kv.Key+"="+r.mapPath(string(kv.Value))) // a string in 1.34, bytes in 1.37
	}
	logPath := filepath.Join(r.logDir, id+".log")
	if log, err := os.Create(logPath); err == nil {
		cmd.Stdout, cmd.Stderr = log, log
		defer func() { _ = log.Close() }() // the child holds its own descriptor
	}
	if err := cmd.Start(); err != nil {
		// As a runtime whose exec fails: the container ends at once with 128.
		klog.ErrorS(err, "exec-command-prefix: start failed", "container", id, "argv", argv)
		r.finish(id, 128, "StartError", err.Error())
		return nil
	}
	klog.InfoS("exec-command-prefix: started", "container", id, "name", config.Metadata.GetName(), "pid", cmd.Process.Pid, "argv", argv, "log", logPath)
	r.mu.Lock()
	r.procs[id] = cmd.Process
	r.mu.Unlock()
	go func() {
		err := cmd.Wait()
		code, reason := 0, "Completed"
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			code, reason = exitErr.ExitCode(), "Error"
			if code < 0 { // killed by a signal
				code = 137
			}
		} else if err != nil {
			code, reason = 128, "Error"
		}
		r.mu.Lock()
		delete(r.procs, id)
		r.mu.Unlock()
		klog.InfoS("exec-command-prefix: exited", "container", id, "exitCode", code)
		r.finish(id, int32(code), reason, "")
	}()
	return nil
}

// finish marks the container exited in the fake runtime; the kubelet's PLEG
// sees it at its next relist.
func (r *execRuntime) finish(id string, code int32, reason, message string) {
	r.fake.Lock()
	defer r.fake.Unlock()
	if c, ok := r.fake.Containers[id]; ok && c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		c.State = runtimeapi.ContainerState_CONTAINER_EXITED
		c.ExitCode = code
		c.Reason = reason
		c.Message = message
		c.FinishedAt = time.Now().UnixNano()
	}
}

// kill ends the container's process, if any (SIGKILL: the kubelet's grace
// period is not modelled).
func (r *execRuntime) kill(id string) {
	r.mu.Lock()
	p := r.procs[id]
	delete(r.configs, id)
	r.mu.Unlock()
	if p != nil {
		_ = p.Kill()
	}
}

func (r *execRuntime) StopContainer(ctx context.Context, id string, timeout int64) error {
	r.kill(id)
	return r.RuntimeService.StopContainer(ctx, id, timeout)
}

func (r *execRuntime) RemoveContainer(ctx context.Context, id string) error {
	r.kill(id)
	return r.RuntimeService.RemoveContainer(ctx, id)
}
