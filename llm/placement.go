package llm

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm/offload"
)

// placement is where Open puts the model: the device, the llama.cpp device
// index, and what is offloaded.
type placement struct {
	dev   device
	index uint64 // the device's index among ggml's devices (llama.cpp's device id)
	info  parley.Device
	// huge moves the weights onto huge pages after the load (hugepages.go):
	// nil when they are not; closed before the model is freed.
	huge *collapser
}

// placeModel chooses the device and the layers to offload (cfg.GPULayers:
// 0, offload.Auto or a count) and resolves flash attention "auto" (on with
// offloaded layers, off without), logging one line that says what the
// model runs on and why. Without a GPU it places everything on the CPU and
// says so; that is not an error. noGPU says where GPU backends were looked
// for, for the log line of a machine without one.
func placeModel(cfg Config, meta metadata, ds []device, noGPU string, log *zap.Logger) (placement, error) {
	layersTotal := meta.info.Layers + 1 // blocks plus the output head
	gpu, index, hasGPU := firstGPU(ds)
	p := placement{index: uint64(index)}
	cpuOnly := func(why string) placement { return cpuPlacement(cfg, meta, ds, why, log) }
	if cfg.GPULayers < offload.Auto {
		return p, fmt.Errorf("gpu layers: want auto (-1), 0 or a positive count, got %d", cfg.GPULayers)
	}
	if cfg.GPULayers == 0 {
		return cpuOnly("--gpu-layers is 0"), nil
	}
	if !hasGPU {
		return cpuOnly("no GPU found (" + noGPU + ")"), nil
	}

	// What the offload costs: the blocks' weights from the GGUF, their KV
	// cache for every session, and the compute buffers of one micro-batch.
	// An encoder has no KV cache (archHasKV), as Inspect's estimate says.
	m := meta.offload
	shape := meta.shape
	shape.MicroBatch, shape.ContextPerSeq, shape.FlashAttention = cfg.BatchSize, cfg.ContextLength, flashAttention(cfg, true)
	if archHasKV(meta.info.Architecture) {
		kvPerToken := kvBytesPerLayerToken(meta, cfg.KVCacheType)
		m.KVBytesPerLayer = uint64(kvPerToken * float64(ctxPadded(cfg.ContextLength)*cfg.CacheSlots))
	} else {
		shape.ContextPerSeq = cfg.BatchSize
	}
	m.ComputeBytes = offload.ComputeEstimate(shape)

	layers, reason := cfg.GPULayers, ""
	if layers == offload.Auto {
		plan := offload.Fit(m, gpu.free)
		layers, reason = plan.Layers, plan.Reason
	} else {
		layers = min(layers, layersTotal)
		reason = "--gpu-layers " + fmt.Sprint(cfg.GPULayers)
		if need := offload.Need(m, layers); need+offload.Margin(gpu.free) > gpu.free {
			log.Warn("--gpu-layers may not fit in the GPU's free memory (lower it, --ctx or --parallel, or use auto)",
				zap.Int("gpu_layers", layers), zap.Uint64("estimate_mib", need/offload.MiB), zap.Uint64("free_mib", gpu.free/offload.MiB))
		}
	}
	if layers == 0 {
		return cpuOnly(fmt.Sprintf("%s (%s): %s", gpu.name, gpu.description, reason)), nil
	}
	p.dev = gpu
	p.info = parley.Device{
		Backend: gpu.name, Name: gpu.description, Type: "gpu",
		MemoryTotal: gpu.total, MemoryFreeAtLoad: gpu.free,
		GPULayers: layers, LayersOffloaded: layers, LayersTotal: layersTotal,
		FlashAttention: flashAttention(cfg, true), KVUnified: cfg.KVUnified == "on",
	}
	log.Info("running on the GPU",
		zap.String("backend", gpu.name), zap.String("device", gpu.description),
		zap.Uint64("memory_total_mib", gpu.total/offload.MiB), zap.Uint64("memory_free_mib", gpu.free/offload.MiB),
		zap.Int("gpu_layers", layers), zap.Int("layers_total", layersTotal),
		zap.Uint64("estimate_mib", offload.Need(m, layers)/offload.MiB),
		zap.Bool("flash_attn", p.info.FlashAttention), zap.Bool("kv_unified", p.info.KVUnified), zap.String("why", reason))
	return p, nil
}

// flashAttention resolves cfg.FlashAttention: on, off, or with auto on
// only when layers are offloaded (on the CPU it does not pay: BENCHMARKS.md, "Flash attention on CPU").
func flashAttention(cfg Config, offloaded bool) bool {
	switch cfg.FlashAttention {
	case "on":
		return true
	case "auto":
		return offloaded
	}
	return false
}

// cpuPlacement places the model on the CPU, logging why.
func cpuPlacement(cfg Config, meta metadata, ds []device, why string, log *zap.Logger) placement {
	fa := flashAttention(cfg, false)
	cpu := cpuDevice(ds)
	p := placement{dev: cpu, info: parley.Device{
		Backend: cpu.name, Name: cpu.description, Type: "cpu",
		MemoryTotal: cpu.total, MemoryFreeAtLoad: cpu.free,
		LayersTotal: meta.info.Layers + 1, FlashAttention: fa, KVUnified: cfg.KVUnified == "on",
	}}
	log.Info("running on the CPU: "+why,
		zap.String("backend", cpu.name), zap.String("device", cpu.description),
		zap.Uint64("memory_total_mib", cpu.total/offload.MiB), zap.Uint64("memory_free_mib", cpu.free/offload.MiB),
		zap.Int("gpu_layers", 0), zap.Bool("flash_attn", p.info.FlashAttention), zap.Bool("kv_unified", p.info.KVUnified))
	return p
}
