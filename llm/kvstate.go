package llm

/*
// LLAMA_COMMIT is the binding's build-info.cpp global.
extern const char *LLAMA_COMMIT;
static const char *parley_llama_commit(void) { return LLAMA_COMMIT; }
*/
import "C"

// stateBuild names the llama.cpp build that writes and reads the KV swap's
// states (backend.StateSeqSave): a state from another build is not read
// back. The embedded engine's is the commit the binding was built from; the
// current engine's the ggml version its libraries are pinned to.
func stateBuild(engine string) string {
	if engine == EngineCurrent {
		return engine + " ggml " + CurrentGGMLVersion
	}
	return engine + " llama.cpp " + C.GoString(C.parley_llama_commit())
}
