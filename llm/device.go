package llm

/*
#include <stddef.h>
// ggml-backend.h is not included here (its include path belongs to the
// binding); these match its declarations. enum ggml_backend_dev_type is a
// C enum (an int): CPU 0, GPU 1, IGPU 2, ACCEL 3.
struct ggml_backend_device;
typedef struct ggml_backend_device * parley_dev_t;
extern size_t       ggml_backend_dev_count(void);
extern parley_dev_t ggml_backend_dev_get(size_t index);
extern const char * ggml_backend_dev_name(parley_dev_t device);
extern const char * ggml_backend_dev_description(parley_dev_t device);
extern void         ggml_backend_dev_memory(parley_dev_t device, size_t * free, size_t * total);
extern int          ggml_backend_dev_type(parley_dev_t device);
*/
import "C"

// ggml device types (enum ggml_backend_dev_type).
const (
	devTypeCPU  = 0
	devTypeGPU  = 1
	devTypeIGPU = 2
)

// device is one ggml backend device, as the loaded backends report it.
type device struct {
	dev         C.parley_dev_t
	name        string // "CUDA0", "CPU"
	description string // "NVIDIA H100 80GB HBM3"
	gpu         bool
	free, total uint64 // bytes, when enumerated
	// mem reads the memory of a device that the current engine's
	// libraries enumerated (dev is nil for those).
	mem func() (free, total uint64)
}

// devices lists the backend devices ggml loaded (llama.BackendInit loads the
// backend libraries found beside the executable first). The CPU is always
// one of them; a CUDA library whose driver or GPU is missing registers no
// device.
func devices() []device {
	var ds []device
	for i := range C.ggml_backend_dev_count() {
		d := C.ggml_backend_dev_get(i)
		if d == nil {
			continue
		}
		dv := device{
			dev:         d,
			name:        C.GoString(C.ggml_backend_dev_name(d)),
			description: C.GoString(C.ggml_backend_dev_description(d)),
		}
		switch C.ggml_backend_dev_type(d) {
		case devTypeGPU, devTypeIGPU:
			dv.gpu = true
		}
		dv.free, dv.total = dv.memory()
		ds = append(ds, dv)
	}
	return ds
}

// memory reads the device's free and total memory now (a CUDA call on a
// GPU: safe from any goroutine, and cheap enough for a metrics scrape).
func (d device) memory() (free, total uint64) {
	if d.mem != nil {
		return d.mem()
	}
	if d.dev == nil {
		return 0, 0
	}
	var f, t C.size_t
	C.ggml_backend_dev_memory(d.dev, &f, &t)
	return uint64(f), uint64(t)
}

// firstGPU returns the first GPU among ds and its index there (llama.cpp's
// device id): the main device when several are present (Parley does not
// split a model across GPUs). ok is false when ds has none.
func firstGPU(ds []device) (gpu device, index int, ok bool) {
	for i, d := range ds {
		if d.gpu {
			return d, i, true
		}
	}
	return device{}, 0, false
}

// cpuDevice returns the CPU device (its memory is the host's).
func cpuDevice(ds []device) device {
	for _, d := range ds {
		if !d.gpu && d.name == "CPU" {
			return d
		}
	}
	return device{name: "CPU", description: "CPU"}
}
