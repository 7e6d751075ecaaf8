#!/usr/bin/env bash
# Usage: scripts/dockerfile-check.sh [DOCKERFILE]   (default: the repo's; its folder is the build context)
#
# Checks the Dockerfile without Docker (no Docker engine runs on the project's machines). Best effort, and honest
# about it:
#
# What it does
#   - parses the Dockerfile (stages, ARG defaults, ENV, WORKDIR, RUN, COPY, USER, VOLUME, EXPOSE, HEALTHCHECK,
#     ENTRYPOINT/CMD), checks the builder's Go image tag against go.mod and its apt packages against this host;
#   - runs the builder's `go` commands here with the stage's ENV (WORKDIR mapped to this checkout, the -o output
#     into a temp dir), i.e. the same flags (-trimpath, CGO_*, -march) as the image;
#   - maps every library ldd finds for that binary to its Debian package (dpkg -S) and checks each one is installed
#     by the runtime stage or is part of the base image (modelled as Debian's essential packages plus apt and their
#     dependencies, which is what debian:bookworm-slim holds);
#   - checks the runtime stage: non-root USER, VOLUME /models holding PARLEY_MODEL, EXPOSE 8000, COPY --from the
#     builder's output, a HEALTHCHECK;
#   - for Dockerfile.cuda (runtime FROM nvidia/cuda:*, Ubuntu): checks the binary's libraries by name against what
#     every Ubuntu base holds, the CUDA stage statically (a devel image, scripts/build-cuda.sh with architectures
#     80;86;89;90 at least, its output copied to ../lib/ollama beside the binary, where the binding looks);
#   - checks that the image carries the current engine (llm/current.go) as `make run` finds it: the runtime stage
#     copies a folder of real files (links resolved) to lib/llama-current beside the binary's bin/ from a stage that
#     installs the pinned package (npm ci in scripts/engine) and runs scripts/build-current-backend.sh cpu at the
#     builder's MARCH; lays the binary out here the same way, with this checkout's lib/llama-current (make
#     setup-engine, the same script; $PARLEY_ENGINE_LIB when set) beside it, maps those libraries' dependencies and
#     the libffi the binary loads at start to packages as above, and checks that the server it starts runs the
#     current engine (/info's engine) with no flag (PARLEY_SKIP_CURRENT_ENGINE=1: the static part only);
#   - checks that the server, on this machine without a GPU, reports the CPU in /health and says so in one log line;
#   - runs the binary the way the image would (ENTRYPOINT, the runtime ENV with PARLEY_MODEL pointing at the test
#     model and PARLEY_ADDR moved to a free loopback port), runs the HEALTHCHECK command until it passes, checks it
#     fails once the server has stopped, and that SIGTERM ends the server with status 0.
# What it cannot check
#   the real base images' contents (the host is Debian bookworm like both stages, and the package model above
#   stands in for them), the engine stage's own run (it needs the npm registry; this checkout's lib/llama-current,
#   made by the same script, stands in for its output), BuildKit's cache mount, COPY/.dockerignore semantics, file
#   ownership and the non-root user at
#   run time (the check runs as whoever runs it), and networking inside a container; for Dockerfile.cuda also the
#   CUDA compile itself (17 minutes per architecture on 2 cores: `make cuda`), NVIDIA's image contents beyond the
#   Ubuntu base, and the GPU (scripts/bench-gpu.sh on a GPU machine covers that).
#
# The go build uses -trimpath and other paths than `make build`, so its first run compiles llama.cpp once more
# (about 3 minutes on 2 cores); later runs reuse Go's build cache.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=$(command -v python3 || echo /usr/bin/python3)
exec "$py" -u - "$root" "${1:-$root/Dockerfile}" <<'EOF'
import atexit
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO, DOCKERFILE = sys.argv[1], os.path.abspath(sys.argv[2])
ROOT = os.path.dirname(DOCKERFILE)  # the build context, as in `docker build .` next to the Dockerfile
MODEL = os.environ.get("PARLEY_TEST_MODEL") or os.path.join(REPO, "..", "shared", "models", "stories260K.gguf")
START_TIMEOUT = 120  # seconds for the server to load stories260K and pass its health check
STOP_TIMEOUT = 60  # seconds a SIGTERM'd server may take to exit

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def ok(msg):
    print("ok:  ", msg)


def die(msg):
    print("FAIL:", msg)
    sys.exit(1)


# ---- parsing -------------------------------------------------------------------------------------------------

def instructions(path):
    """(lineno, KEYWORD, rest) per instruction: comments dropped, backslash continuations joined."""
    out, buf, start = [], "", 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            s = line.rstrip("\n")
            if not buf and (not s.strip() or s.lstrip().startswith("#")):
                continue
            if buf and s.lstrip().startswith("#"):
                continue  # comment lines inside a continued instruction are dropped by Docker too
            if not buf:
                start = n
            if s.endswith("\\"):
                buf += s[:-1] + " "
                continue
            buf += s
            kw, _, rest = buf.strip().partition(" ")
            out.append((start, kw.upper(), rest.strip()))
            buf = ""
    return out


def expand(s, env):
    """Docker's ${VAR}, ${VAR:-default} and $VAR substitution."""
    def sub(m):
        name = m.group(1) or m.group(3)
        val = env.get(name, "")
        if m.group(2) is not None and not val:
            return m.group(2)
        return val
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, s)


def kv_pairs(rest, env):
    """ENV/ARG arguments: `K=V K2="V 2"` or the legacy `K V`."""
    words = shlex.split(rest)
    if words and "=" not in words[0]:
        return [(words[0], expand(" ".join(words[1:]), env))]
    pairs = []
    for w in words:
        k, eq, v = w.partition("=")
        pairs.append((k, expand(v, env) if eq else None))
    return pairs


def strip_flags(rest):
    """Drop leading --flag=value options (RUN --mount=..., COPY --from=..., HEALTHCHECK --interval=...)."""
    flags = {}
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        k, _, v = flag[2:].partition("=")
        flags[k] = v
        rest = rest.lstrip()
    return flags, rest


def exec_form(rest):
    """A JSON exec form (["a", "b"]) as a list, or a shell form as ["/bin/sh", "-c", rest]."""
    import json
    if rest.startswith("["):
        return json.loads(rest)
    return ["/bin/sh", "-c", rest]


class Stage:
    def __init__(self, image, name):
        self.image, self.name = image, name
        self.args, self.env, self.workdir = {}, {}, "/"
        self.runs, self.copies = [], []
        self.user, self.volumes, self.expose = None, [], []
        self.healthcheck, self.entrypoint, self.cmd = None, None, None

    def vars(self):
        return {**self.args, **self.env}


def parse(path):
    stages, global_args = [], {}
    for n, kw, rest in instructions(path):
        if kw == "FROM":
            words = rest.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            stages.append(Stage(expand(words[0], global_args), name))
            continue
        if not stages:
            if kw == "ARG":
                for k, v in kv_pairs(rest, global_args):
                    global_args[k] = v or ""
            continue
        st = stages[-1]
        if kw == "ARG":
            for k, v in kv_pairs(rest, st.vars()):
                st.args[k] = v if v is not None else global_args.get(k, "")
        elif kw == "ENV":
            for k, v in kv_pairs(rest, st.vars()):
                st.env[k] = v or ""
        elif kw == "WORKDIR":
            st.workdir = os.path.join(st.workdir, expand(rest, st.vars()))
        elif kw == "RUN":
            _, cmd = strip_flags(rest)
            st.runs.append((n, cmd, st.workdir, dict(st.vars())))
        elif kw == "COPY":
            flags, args = strip_flags(rest)
            st.copies.append((flags.get("from"), args.split()))
        elif kw == "USER":
            st.user = expand(rest, st.vars())
        elif kw == "VOLUME":
            st.volumes += exec_form(rest) if rest.startswith("[") else rest.split()
        elif kw == "EXPOSE":
            st.expose += [p.split("/")[0] for p in rest.split()]
        elif kw == "HEALTHCHECK":
            _, cmd = strip_flags(rest)
            st.healthcheck = None if cmd.upper() == "NONE" else exec_form(cmd[len("CMD"):].strip())
        elif kw == "ENTRYPOINT":
            st.entrypoint = exec_form(rest)
        elif kw == "CMD":
            st.cmd = exec_form(rest)
    return stages


def segments(cmd):
    """Split a shell command line on && ; || into simple commands (good enough for Dockerfile RUN lines)."""
    return [s.strip() for s in re.split(r"&&|\|\||;", cmd) if s.strip()]


def apt_packages(stage):
    pkgs = []
    for _, cmd, _, _ in stage.runs:
        for seg in segments(cmd):
            words = shlex.split(seg)
            if "apt-get" in words and "install" in words:
                pkgs += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    return pkgs


# Libraries of libc6, libstdc++6 and libgcc-s1, which every Ubuntu image (NVIDIA's CUDA images too) holds, and
# libffi8's, which apt pulls into every Ubuntu base (apt -> libgnutls30 -> libp11-kit0 -> libffi8).
UBUNTU_BASE_LIBS = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2",
                    "/lib64/ld-linux-x86-64.so.2", "libpthread.so.0", "libdl.so.2", "libresolv.so.2", "librt.so.1",
                    "libffi.so.8"}


def check_cuda_stage(stages, final, image_binary):
    """Dockerfile.cuda's CUDA stage, statically (nvcc needs 17 minutes per architecture here, and no GPU is needed
    to check where its output lands): a devel image, scripts/build-cuda.sh run with architectures covering Ampere to
    Hopper, and its output copied to the ../lib/ollama beside the binary, where the binding looks."""
    cuda = [st for st in stages if "-devel" in st.image and st.image.startswith("nvidia/cuda:")]
    if not cuda:
        fail("a CUDA runtime image but no nvidia/cuda:*-devel* stage that builds the backend")
        return
    st = cuda[0]
    ok(f"CUDA stage {st.name}: {st.image}")
    archs = st.args.get("CUDA_ARCHITECTURES", "").strip('"')
    want = {"80", "86", "89", "90"}
    if not want <= set(archs.split(";")):
        fail(f"CUDA_ARCHITECTURES={archs!r}: want at least 80;86;89;90 (Ampere to Hopper)")
    else:
        ok(f"CUDA_ARCHITECTURES={archs} (Ampere to Hopper)")
    runs = " ".join(cmd for _, cmd, _, _ in st.runs)
    m = re.search(r"build-cuda\.sh\s+(\S+)", runs)
    if not m:
        fail(f"stage {st.name} does not run scripts/build-cuda.sh OUT_DIR")
        return
    out_dir = m.group(1)
    script = os.path.join(ROOT, "scripts", "build-cuda.sh")
    if not any(args[0] == "scripts/build-cuda.sh" for src, args in st.copies if not src):
        fail(f"stage {st.name} does not COPY scripts/build-cuda.sh")
    elif run(["bash", "-n", script]).returncode != 0:
        fail("scripts/build-cuda.sh: bash -n finds a syntax error")
    else:
        ok(f"stage {st.name} runs scripts/build-cuda.sh into {out_dir} (bash -n clean)")
    want_lib = os.path.join(os.path.dirname(os.path.dirname(image_binary)), "lib", "ollama")
    got = [args[-1].rstrip("/") for src, args in final.copies if src == st.name and args[0].rstrip("/") == out_dir]
    if got != [want_lib]:
        fail(f"the runtime copies {out_dir} to {got or 'nowhere'}: the binding looks in {want_lib} (../lib/ollama beside {image_binary})")
    else:
        ok(f"COPY --from={st.name} {out_dir} {want_lib}: ../lib/ollama beside {image_binary}, found with no environment variable")


# ---- host facts --------------------------------------------------------------------------------------------

def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def installed(pkg):
    r = run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}", pkg])
    return r.returncode == 0 and r.stdout.startswith("ii")


def owner(path):
    """The Debian package that ships a library path (usr-merged layouts: try the resolved path too)."""
    for p in (path, os.path.realpath(path), "/usr" + path if not path.startswith("/usr") else path):
        r = run(["dpkg", "-S", p])
        if r.returncode == 0:
            return r.stdout.split(":")[0].strip()
    return None


def slim_base():
    """Packages debian:bookworm-slim holds, modelled as the essential set plus apt, with their dependencies."""
    r = run(["dpkg-query", "-W", "-f=${Package} ${Essential}\n"])
    essential = [l.split()[0] for l in r.stdout.splitlines() if l.endswith(" yes")]
    r = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
             "--no-breaks", "--no-replaces", "--no-enhances", "apt"] + essential)
    base = {l.strip().split(":")[0] for l in r.stdout.splitlines() if l and not l.startswith((" ", "<"))}
    return base | set(essential) | {"apt"}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- the check ---------------------------------------------------------------------------------------------

if not os.path.isfile(DOCKERFILE):
    die(f"{DOCKERFILE}: no such file")
stages = parse(DOCKERFILE)
if len(stages) < 2:
    die(f"{DOCKERFILE}: want a multi-stage build (builder + runtime), found {len(stages)} stage(s)")
final = stages[-1]
copy_from = [(src, args) for src, args in final.copies if src]
if not copy_from:
    die("the runtime stage copies nothing from a builder stage (COPY --from=...)")
builder_ref, copy_args = copy_from[0]
builder = next((s for s in stages if s.name == builder_ref), None)
if builder is None and builder_ref.isdigit() and int(builder_ref) < len(stages):
    builder = stages[int(builder_ref)]
if builder is None:
    die(f"COPY --from={builder_ref}: no such stage")
print(f"stages: builder {builder.image} as {builder.name}, runtime {final.image}")

# Host and images must be the same Debian release, or the package facts below say nothing about the images.
codename = ""
with open("/etc/os-release") as f:
    for line in f:
        if line.startswith("VERSION_CODENAME="):
            codename = line.strip().split("=", 1)[1].strip('"')
# NVIDIA's CUDA images (Dockerfile.cuda's runtime) are Ubuntu: Debian's package facts do not describe them, so the
# runtime's libraries are checked by name against what every Ubuntu base holds, and the CUDA stage statically.
cuda_runtime = final.image.startswith("nvidia/cuda:")
for st in (builder, final):
    if st is final and cuda_runtime:
        ok(f"{st.image}: NVIDIA's CUDA runtime image (Ubuntu); its libraries are checked by name below")
    elif codename and codename not in st.image:
        fail(f"{st.image} is not Debian {codename} like this host: the package checks below do not apply to it")
    else:
        ok(f"{st.image}: same Debian release as this host ({codename})")

# Go: the image's Go minor version must satisfy go.mod's go line (and be what builds here).
with open(os.path.join(ROOT, "go.mod")) as f:
    gomod = re.search(r"^go (\d+)\.(\d+)", f.read(), re.M)
tag = re.search(r"golang:(\d+)\.(\d+)", builder.image)
if not tag:
    fail(f"builder image {builder.image} is not a golang:X.Y image")
elif gomod and (int(tag.group(1)), int(tag.group(2))) < (int(gomod.group(1)), int(gomod.group(2))):
    fail(f"builder {builder.image} is older than go.mod's go {gomod.group(1)}.{gomod.group(2)}")
else:
    hostgo = run(["go", "env", "GOVERSION"]).stdout.strip()
    ok(f"builder {builder.image} satisfies go.mod's go {gomod.group(1)}.{gomod.group(2)} (host builds with {hostgo})")

for pkg in apt_packages(builder):
    if installed(pkg):
        ok(f"builder apt package {pkg}: installed here, so the build below sees the same headers")
    else:
        fail(f"builder apt package {pkg} is not installed here (make setup)")

# The builder's go commands, here: WORKDIR -> this checkout, `-o PATH` -> the temp dir.
tmp = tempfile.mkdtemp(prefix="dockerfile-check.")
atexit.register(shutil.rmtree, tmp, True)  # also when die() exits early
outputs = {}  # image path -> host path
go_cmds = 0
for n, cmd, workdir, env in builder.runs:
    for seg in segments(cmd):
        words = shlex.split(expand(seg, env))
        if not words or words[0] != "go":
            continue
        args = []
        for i, w in enumerate(words):
            if i > 0 and words[i - 1] == "-o":
                host = os.path.join(tmp, os.path.basename(w))
                image_path = w if w.startswith("/") else os.path.join(workdir, w)
                outputs[image_path] = host
                w = host
            args.append(w)
        # ARG and ENV values are both in a RUN's environment; paths under WORKDIR point into this checkout.
        genv = dict(os.environ)
        for k, v in env.items():
            genv[k] = v.replace(workdir, ROOT) if workdir != "/" else v
        shown = " ".join(f"{k}={shlex.quote(genv[k])}" for k in sorted(env))
        print(f"\nDockerfile:{n}: {' '.join(words)}\n  here: {shown} {' '.join(args)}")
        t0 = time.time()
        r = subprocess.run(args, cwd=ROOT, env=genv)
        if r.returncode != 0:
            die(f"Dockerfile:{n}: `{' '.join(words)}` failed (exit {r.returncode})")
        ok(f"Dockerfile:{n}: {words[0]} {words[1]} ({time.time() - t0:.0f}s)")
        go_cmds += 1
if not outputs:
    die("the builder stage has no `go build -o PATH` command")

# What the runtime stage copies must be what the builder built.
src, dst = copy_args[0], copy_args[-1]
if src not in outputs:
    die(f"COPY --from={builder_ref} {src}: the builder writes {', '.join(outputs)}, not {src}")
binary = outputs[src]
image_binary = dst if not dst.endswith("/") else os.path.join(dst, os.path.basename(src))
ok(f"COPY --from={builder_ref} {src} {dst}: the binary the builder produced")

# check_lib_package says whether the package that ships lib (at path) is in the image.
def check_lib_package(lib, path, runtime_pkgs, base):
    pkg = owner(path)
    if pkg is None:
        fail(f"{lib} ({path}): no Debian package ships it, so no image has it")
    elif pkg in runtime_pkgs:
        ok(f"{lib}: {pkg}, installed by the runtime stage")
    elif pkg in base:
        ok(f"{lib}: {pkg}, part of the slim base (essential + apt)")
    else:
        fail(f"{lib}: package {pkg} is neither installed by the runtime stage nor part of the slim base")


# Shared libraries: each must come from a package the runtime stage installs or the slim base holds.
runtime_pkgs = apt_packages(final)
for pkg in runtime_pkgs:
    if run(["apt-cache", "show", pkg]).returncode != 0:
        fail(f"runtime apt package {pkg} is unknown to apt here (Debian {codename})")
base = slim_base()
r = run(["ldd", binary])
print()
if "not a dynamic executable" in r.stdout + r.stderr:
    ok("static binary: it needs no shared libraries")
elif r.returncode != 0:
    die(f"ldd {binary}: {r.stderr.strip()}")
for line in r.stdout.splitlines() if r.returncode == 0 else []:
    line = line.strip()
    if "not found" in line:
        fail(f"ldd: {line}")
        continue
    m = re.match(r"(\S+)(?: => (\S+))? \(0x", line)
    if not m or m.group(1).startswith("linux-vdso"):
        continue
    lib, path = m.group(1), m.group(2) or m.group(1)
    if cuda_runtime:
        if lib in UBUNTU_BASE_LIBS:
            ok(f"{lib}: in every Ubuntu base image (libc6, libstdc++6, libgcc-s1), so in the CUDA runtime image")
        else:
            fail(f"{lib}: not a library every Ubuntu base image holds, and the CUDA runtime stage installs nothing")
        continue
    check_lib_package(lib, path, runtime_pkgs, base)

if cuda_runtime:
    print()
    check_cuda_stage(stages, final, image_binary)

# Runtime stage facts.
print()
if final.user in (None, "", "root", "0") or (final.user or "").startswith(("root:", "0:")):
    fail(f"runtime USER is {final.user!r}: want a non-root user")
else:
    ok(f"runtime USER {final.user} (non-root)")
model_path = final.env.get("PARLEY_MODEL", "")
vols = [v.rstrip("/") for v in final.volumes]
if not any(model_path.startswith(v + "/") for v in vols):
    fail(f"PARLEY_MODEL={model_path!r} is not on a VOLUME ({', '.join(vols) or 'none'})")
else:
    ok(f"PARLEY_MODEL={model_path} on VOLUME {', '.join(vols)}")
if "8000" not in final.expose:
    fail(f"EXPOSE {final.expose}: want 8000")
else:
    ok("EXPOSE 8000")
addr = final.env.get("PARLEY_ADDR", "")
if not addr.endswith(":8000") or addr.startswith("127."):
    fail(f"PARLEY_ADDR={addr!r}: want all interfaces on port 8000 inside the container")
else:
    ok(f"PARLEY_ADDR={addr}")
if not final.healthcheck:
    fail("no HEALTHCHECK in the runtime stage")
entry = (final.entrypoint or []) + (final.cmd or [])
if not entry:
    die("the runtime stage has neither ENTRYPOINT nor CMD")


# Libraries the binary loads at run time (dlopen), which ldd does not list: the Go module that loads each one.
DLOPENED = {"github.com/jupiterrider/ffi": "libffi.so.8"}


def check_dlopened(runtime_pkgs, base):
    """The libraries the binary loads itself at start (libffi for the current engine's calls: without it the
    process panics before main), found by the module that loads them in the binary's build information."""
    deps = run(["go", "version", "-m", binary]).stdout
    for mod, lib in DLOPENED.items():
        if mod not in deps:
            continue
        if cuda_runtime:
            if lib in UBUNTU_BASE_LIBS:
                ok(f"{lib} (loaded at start by {mod}): in every Ubuntu base image, so in the CUDA runtime image")
            else:
                fail(f"{lib} (loaded at start by {mod}): not a library every Ubuntu base image holds")
            continue
        r = run(["ldconfig", "-p"])
        m = re.search(r"^\s*" + re.escape(lib) + r" \(.*?\) => (\S+)", r.stdout, re.M)
        if not m:
            fail(f"{lib} (loaded by {mod} at start): not on this host either")
            continue
        check_lib_package(lib + f" (loaded at start by {mod})", m.group(1), runtime_pkgs, base)


def check_engine(stages, final, image_binary):
    """The current engine in the image, as `make run` finds it: lib/llama-current beside the binary's bin/ (the
    binary's default, llm.DefaultCurrentLibDir). Returns the host folder that stands in for it, or None."""
    want = os.path.join(os.path.dirname(os.path.dirname(image_binary)), "lib", "llama-current")
    got = [(src, args) for src, args in final.copies if src and args[-1].rstrip("/") == want]
    if not got:
        fail(f"the image does not carry the current engine: no COPY --from=STAGE ... {want} "
             f"(lib/llama-current beside {image_binary}'s bin/, where it looks, as after make setup-engine)")
        return None
    src, args = got[0]
    st = next((x for x in stages if x.name == src), None)
    if st is None:
        fail(f"COPY --from={src} {args[0]} {want}: no such stage")
        return None
    ok(f"COPY --from={src} {args[0]} {want}: lib/llama-current beside {image_binary}'s bin/, found with no flag")
    copied = " ".join(a for s, al in st.copies if not s for a in al)
    runs = [(cmd, env) for _, cmd, _, env in st.runs]
    joined = " && ".join(cmd for cmd, _ in runs)
    for f in ("scripts/engine/package.json", "scripts/engine/package-lock.json", "scripts/build-current-backend.sh",
              "scripts/ggml-simd.sh"):
        if f not in copied:
            fail(f"stage {src} does not COPY {f}")
    if not re.search(r"cd scripts/engine && npm ci\b", joined):
        fail(f"stage {src} does not install the pinned package (cd scripts/engine && npm ci)")
    else:
        ok(f"stage {src}: npm ci in scripts/engine (the pinned @node-llama-cpp/linux-x64, as make setup-engine)")
    build = next(((cmd, env) for cmd, env in runs if re.search(r"build-current-backend\.sh cpu\b", cmd)), None)
    if build is None:
        fail(f"stage {src} does not run scripts/build-current-backend.sh cpu (ggml's CPU backend from the pinned source)")
        return None
    cmd, env = build
    march = re.search(r"PARLEY_MARCH=(\S+)", cmd)
    march = expand(march.group(1), env) if march else env.get("PARLEY_MARCH", "x86-64-v3")
    if march != builder.args.get("MARCH", march):
        fail(f"stage {src} builds the CPU backend at {march}, the binary at {builder.args.get('MARCH')}")
    else:
        ok(f"stage {src}: scripts/build-current-backend.sh cpu at PARLEY_MARCH={march}, the builder's MARCH")
    if not any(re.search(r"cp\s+(-\w*L\w*|--dereference)\b[^&]*\s" + re.escape(args[0].rstrip("/")) + r"/?(\s|$)", c)
               for c, _ in runs):
        fail(f"stage {src} does not copy the engine folder to {args[0]} with its links resolved (cp -L): "
             "the folder links into node_modules, which the runtime stage does not have")
    else:
        ok(f"stage {src}: {args[0]} holds the files, links resolved (cp -L)")
    if run(["bash", "-n", os.path.join(ROOT, "scripts", "build-current-backend.sh")]).returncode != 0:
        fail("scripts/build-current-backend.sh: bash -n finds a syntax error")
    for pkg in apt_packages(st):
        if run(["apt-cache", "show", pkg]).returncode != 0:
            fail(f"engine stage apt package {pkg} is unknown to apt here (Debian {codename})")
    if os.environ.get("PARLEY_SKIP_CURRENT_ENGINE") == "1":
        ok("PARLEY_SKIP_CURRENT_ENGINE=1: the server below runs without the current engine")
        return None
    lib = os.environ.get("PARLEY_ENGINE_LIB") or os.path.join(REPO, "lib", "llama-current")
    if not os.path.isfile(os.path.join(lib, "libllama.so")):
        fail(f"no current engine in {lib} to stand in for stage {src}'s output (make setup-engine)")
        return None
    return lib


def lay_out(lib, runtime_pkgs, base):
    """The image's /usr/local/bin and /usr/local/lib/llama-current here: a copy of the binary and of lib with its links
    resolved, as the engine stage copies it. Returns the binary's path; the engine's libraries' own dependencies are
    mapped to packages as the binary's are."""
    top = os.path.join(tmp, "image")
    os.makedirs(os.path.join(top, "bin"))
    host_bin = os.path.join(top, "bin", os.path.basename(image_binary))
    shutil.copy2(binary, host_bin)
    dst = os.path.join(top, "lib", "llama-current")
    shutil.copytree(lib, dst, symlinks=False)
    print(f"\nthe current engine: {lib} -> {dst}")
    seen = set()
    for name in sorted(os.listdir(dst)):
        if not name.endswith(".so"):
            continue
        r = run(["ldd", os.path.join(dst, name)], env={**os.environ, "LD_LIBRARY_PATH": dst})
        for line in r.stdout.splitlines():
            line = line.strip()
            if "not found" in line:
                fail(f"ldd {name}: {line}")
                continue
            m = re.match(r"(\S+)(?: => (\S+))? \(0x", line)
            if not m or m.group(1).startswith("linux-vdso") or m.group(1) in seen:
                continue
            path = m.group(2) or m.group(1)
            if os.path.dirname(path) == dst:
                continue  # one of the engine's own libraries
            seen.add(m.group(1))
            check_lib_package(m.group(1) + " (the current engine's)", path, runtime_pkgs, base)
    return host_bin


print()
engine_lib = None
if cuda_runtime:
    ok("CUDA runtime: the embedded engine and its CUDA backend (lib/ollama) run the GPU; no current engine checked")
else:
    engine_lib = check_engine(stages, final, image_binary)
check_dlopened(runtime_pkgs, base)
if engine_lib:
    binary = lay_out(engine_lib, runtime_pkgs, base)


def on_host(argv):
    return [binary if a == image_binary else a for a in argv]


# Run it as the image would: ENTRYPOINT + CMD, the runtime ENV; the model volume -> the test model, the port ->
# a free loopback one (the check never listens beyond loopback), HOME -> a temp dir (the container user's home).
if not os.path.isfile(MODEL):
    die(f"test model {MODEL} not found")
port = free_port()
renv = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_") and k != "XDG_DATA_HOME"}
renv.update(final.env)
renv.update(PARLEY_MODEL=os.path.abspath(MODEL), PARLEY_ADDR=f"127.0.0.1:{port}", HOME=os.path.join(tmp, "home"))
os.makedirs(renv["HOME"])
print(f"\nrun: PARLEY_MODEL={renv['PARLEY_MODEL']} PARLEY_ADDR={renv['PARLEY_ADDR']} {' '.join(on_host(entry))}")
log = open(os.path.join(tmp, "server.log"), "w+")
server = subprocess.Popen(on_host(entry), env=renv, cwd=renv["HOME"], stdin=subprocess.DEVNULL, stdout=log,
                          stderr=subprocess.STDOUT)


def healthcheck():
    return subprocess.run(on_host(final.healthcheck), env=renv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=10)


def check_device():
    """This machine has no GPU (and the check no CUDA backend beside the binary): the server must say it runs on
    the CPU, in /health and in one log line, and not have crashed getting there."""
    import json
    try:
        body = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5))
    except (urllib.error.URLError, OSError, ValueError) as e:
        fail(f"/health: {e}")
        return
    dev = body.get("device") or {}
    if dev.get("type") != "cpu":
        fail(f"/health device {dev}: want the CPU on a machine without a GPU")
    else:
        ok(f"/health: device {dev.get('backend')} ({dev.get('name')}), type cpu, {dev.get('layers_offloaded')} layers offloaded")
    log.flush()
    with open(log.name) as f:
        lines = [l for l in f if "running on the CPU" in l]
    if len(lines) != 1:
        fail(f"want one log line saying the server runs on the CPU, found {len(lines)}")
    else:
        ok("one log line: " + re.sub(r'.*"msg":"([^"]*)".*', r"\1", lines[0].strip())[:160])


def check_current_engine():
    """With the engine beside the binary and no flag, the server runs it, as `make run` does (--engine auto)."""
    import json
    try:
        info = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=5))
    except (urllib.error.URLError, OSError, ValueError) as e:
        fail(f"/info: {e}")
        return
    engine = info.get("engine", "")
    if not engine.startswith("current llama.cpp"):
        log.flush()
        with open(log.name) as f:
            why = [l.strip()[:300] for l in f if "engine" in l]
        fail(f"/info's engine is {engine!r}: the image's layout does not run the current engine ({why})")
    else:
        ok(f"/info: {engine}, from lib/llama-current beside the binary, with no flag")


try:
    deadline, last = time.time() + START_TIMEOUT, None
    while True:
        if server.poll() is not None:
            log.seek(0)
            print(log.read()[-3000:])
            die(f"the server exited with status {server.returncode} before its health check passed")
        if final.healthcheck:
            last = healthcheck()
            if last.returncode == 0:
                ok(f"HEALTHCHECK {' '.join(final.healthcheck)}: exit 0 once the model is loaded")
                check_device()
                if engine_lib:
                    check_current_engine()
                break
        else:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except (urllib.error.URLError, OSError):
                pass
        if time.time() > deadline:
            out = last.stdout.strip()[-500:] if last else ""
            die(f"HEALTHCHECK did not pass within {START_TIMEOUT}s (last exit {last and last.returncode}): {out}")
        time.sleep(0.2)
    server.send_signal(signal.SIGTERM)
    try:
        rc = server.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        die(f"the server did not exit within {STOP_TIMEOUT}s of SIGTERM (docker stop would SIGKILL it)")
    if rc != 0:
        fail(f"the server exited with status {rc} after SIGTERM (want 0)")
    else:
        ok("SIGTERM (docker stop): exit 0")
    if final.healthcheck:
        r = healthcheck()
        if r.returncode == 0:
            fail("HEALTHCHECK passes with no server running")
        else:
            ok(f"HEALTHCHECK fails with no server (exit {r.returncode})")
finally:
    if server.poll() is None:
        server.kill()
        server.wait()

print()
if failures:
    print(f"Dockerfile check: {len(failures)} problem(s)")
    sys.exit(1)
print("Dockerfile check: ok (within the limits listed in scripts/dockerfile-check.sh)")
EOF
