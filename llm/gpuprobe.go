package llm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	yz "github.com/hybridgroup/yzma/pkg/llama"
)

// The current engine's GPU probe. A prebuilt CUDA library that cannot run
// its kernels on this GPU aborts the process at the first decode (ggml_abort
// on "CUDA error"), and llama.cpp runs in process: it would take every
// session with it. Measured on an H200 (driver 580, CUDA 13.0) with
// @node-llama-cpp/linux-x64-cuda 3.22.1, whose library carries machine code
// for sm_86, sm_89, sm_120 and sm_121 and PTX (ISA 9.1, CUDA 13.1) for the
// others: Hopper has to compile that PTX, the driver is too old for it, and
// the first kernel (rms_norm) failed. So before the current engine puts
// layers on a GPU, a child process (this executable with gpuProbeEnv set,
// whose main calls ServeGPUProbe first thing when GPUProbeChild says so)
// loads the model with one layer there and decodes two tokens. If the
// child fails, or the executable does not serve the probe, the model runs
// on the CPU and one log line says why, with the child's last words.
const (
	gpuProbeEnv     = "PARLEY_GPU_PROBE"      // the child's arguments: libdir \x1f model \x1f flash attention (0/1)
	gpuProbeSkipEnv = "PARLEY_SKIP_GPU_PROBE" // "1": trust the GPU without a probe
	gpuProbeTimeout = 5 * time.Minute         // the model's first read from disk is in it
	gpuProbeOK      = "gpu probe: ok"         // the child's last line on stdout when the GPU ran the decode
)

// GPUProbeChild reports whether this process was started as the current
// engine's GPU probe. A program that opens the current engine with layers
// on a GPU calls it first thing in main (and in TestMain), and when it
// reports true exits with ServeGPUProbe's status, as it does for the chat
// template's sandbox (chat.SandboxChild).
func GPUProbeChild(getenv func(string) string) bool { return getenv(gpuProbeEnv) != "" }

// ServeGPUProbe is the probe child's whole work; it returns the exit
// status (0: the GPU ran the decode).
func ServeGPUProbe(getenv func(string) string) int {
	rc := serveGPUProbe(getenv(gpuProbeEnv))
	if rc == 0 {
		fmt.Println(gpuProbeOK)
	}
	return rc
}

// serveGPUProbe is the child: load the libraries with llama.cpp's log on
// stderr (a CUDA error names itself there), the model with one layer on the
// first GPU, and decode two tokens. Exit status 0 means the GPU ran them.
func serveGPUProbe(arg string) int {
	parts := strings.Split(arg, "\x1f")
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "gpu probe: bad argument")
		return 2
	}
	if err := loadCurrent(parts[0]); err != nil {
		fmt.Fprintln(os.Stderr, "gpu probe:", err)
		return 2
	}
	yz.LogSet(0) // llama.cpp's default: stderr
	mp := yz.ModelDefaultParams()
	mp.NGpuLayers, mp.SplitMode, mp.MainGpu = 1, yz.SplitModeNone, 0
	model, err := yz.ModelLoadFromFile(parts[1], mp)
	if err != nil || model == 0 {
		fmt.Fprintln(os.Stderr, "gpu probe: the model did not load with a layer on the GPU")
		return 1
	}
	cp := yz.ContextDefaultParams()
	cp.NCtx, cp.NBatch, cp.NUbatch, cp.NSeqMax = 64, 64, 64, 1
	cp.FlashAttentionType = yz.FlashAttentionTypeDisabled
	if parts[2] == "1" {
		cp.FlashAttentionType = yz.FlashAttentionTypeEnabled
	}
	lc, err := yz.InitFromModel(model, cp)
	if err != nil || lc == 0 {
		fmt.Fprintln(os.Stderr, "gpu probe: no context")
		return 1
	}
	toks := []yz.Token{0, 1} // any vocabulary has them (BOS may be none)
	for _, t := range toks {
		b := yz.BatchGetOne([]yz.Token{t})
		if rc, err := yz.Decode(lc, b); err != nil || rc != 0 {
			fmt.Fprintln(os.Stderr, "gpu probe: decode failed:", rc, err)
			return 1
		}
	}
	yz.Synchronize(lc)
	return 0
}

// errGPUProbe is probeCurrentGPU's error: the GPU did not run the current
// engine's kernels.
var errGPUProbe = errors.New("the current engine's CUDA library failed a test decode on this GPU")

// probeCurrentGPU runs the child and reports its failure with the tail of
// what it wrote.
func probeCurrentGPU(libDir, model string, flashAttn bool) error {
	if os.Getenv(gpuProbeSkipEnv) == "1" {
		return nil
	}
	if os.Getenv(gpuProbeEnv) != "" {
		// This process was started as a probe and did not serve it: no
		// probe of its own (it would start another of itself).
		return fmt.Errorf("%w: this executable does not serve the probe (its main calls llm.ServeGPUProbe)", errGPUProbe)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("%w: no executable to run it in: %v", errGPUProbe, err)
	}
	return runGPUProbe(exe, libDir, model, flashAttn)
}

// runGPUProbe runs exe as the probe child.
func runGPUProbe(exe, libDir, model string, flashAttn bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), gpuProbeTimeout)
	defer cancel()
	var args []string
	if strings.HasSuffix(exe, ".test") {
		// A Go test binary whose TestMain does not serve the probe runs no
		// tests and exits without the marker.
		args = append(args, "-test.run=^$")
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	fa := "0"
	if flashAttn {
		fa = "1"
	}
	cmd.Env = append(os.Environ(), gpuProbeEnv+"="+libDir+"\x1f"+model+"\x1f"+fa)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w (%v): %s", errGPUProbe, err, probeTail(out.String()))
	}
	if !strings.Contains(out.String(), gpuProbeOK) {
		return fmt.Errorf("%w: this executable does not serve the probe (its main calls llm.ServeGPUProbe)", errGPUProbe)
	}
	return nil
}

// probeTail is the lines of the child's output that say what went wrong:
// the errors llama.cpp and CUDA logged, else its last lines.
func probeTail(s string) string {
	var picked []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		if strings.Contains(l, "error") || strings.Contains(l, "CUDA") && !strings.Contains(l, "get_memory") || strings.HasPrefix(l, "gpu probe") {
			picked = append(picked, l)
		}
	}
	if len(picked) == 0 {
		picked = strings.Split(strings.TrimSpace(s), "\n")
	}
	if len(picked) > 6 {
		picked = picked[len(picked)-6:]
	}
	t := strings.Join(picked, " | ")
	if len(t) > 1500 {
		t = t[len(t)-1500:]
	}
	return t
}
