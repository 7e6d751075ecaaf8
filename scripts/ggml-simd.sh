# Sourced by the scripts that build ggml with CMake (build-llama-server.sh, build-current-backend.sh): ggml_simd
# sets the array ggml_simd_flags to the SIMD level of Parley's cgo build (scripts/env.sh): x86-64-v3 = AVX, AVX2,
# BMI2, F16C, FMA by default; PARLEY_MARCH=native for this machine's best. It fails on any other level.
ggml_simd() {
	case "${PARLEY_MARCH:-x86-64-v3}" in
	native) ggml_simd_flags=(-DGGML_NATIVE=ON) ;;
	x86-64-v3) ggml_simd_flags=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_F16C=ON -DGGML_FMA=ON) ;;
	*)
		echo "PARLEY_MARCH=$PARLEY_MARCH: only x86-64-v3 and native are mapped to ggml's options" >&2
		return 2
		;;
	esac
}
