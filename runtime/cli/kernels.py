"""`mlx-paged kernels list|render`: what the code generator makes, for kernel authors."""

from __future__ import annotations

import argparse
import sys


def add_kernels_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="list or render the generated kernels")
    p.add_argument(
        "action",
        choices=["list", "render"],
        help="list: every kernel spec the routing can pick; render: one spec's source",
    )
    p.add_argument("spec", nargs="?", help="a spec name from `kernels list` (render)")
    p.add_argument(
        "--backend",
        choices=["metal", "cuda"],
        default=None,
        help="list this backend's specs / render the spec for this backend",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="render: the complete source (Metal: as MLX generates it, captured "
        "through mx.export_function; CUDA: MLX's signature around the body)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="render: also compile it (Metal: clang against our MSL shim; CUDA: "
        "NVRTC for sm_90a, printing registers and spills)",
    )
    p.set_defaults(run=run_kernels)


def run_kernels(args: argparse.Namespace) -> int:
    """`kernels list` or `kernels render`; the exit code."""
    if args.action == "list":
        return _list(args.backend)
    if not args.spec:
        print(
            "mlx-paged kernels render: give a spec name, e.g. "
            "decode_simt_metal_bf16_hd128_bs16_g4 (see `mlx-paged kernels list`)",
            file=sys.stderr,
        )
        return 2
    return _render(args)


def _list(backend: str | None) -> int:
    from mlx_paged.kernels.catalog import all_specs
    from mlx_paged.kernels.latent_attention import latent_specs
    from mlx_paged.kernels.layer_kernels import layer_kernel_specs

    count = 0
    for name in [backend] if backend else ["metal", "cuda"]:
        # The MLA and layer kernels come at each model's sizes: a sample of them.
        for spec in all_specs(name) + latent_specs(name) + layer_kernel_specs(name):
            print(spec.name)
            count += 1
    print(f"{count} specs", file=sys.stderr)
    return 0


def _render(args: argparse.Namespace) -> int:
    import dataclasses

    from mlx_paged.codegen.build import KernelRenderError
    from mlx_paged.kernels import gated_delta, latent_attention, layer_kernels, quantize_rows
    from mlx_paged.kernels.kernel_spec import KernelSpec, UnsupportedSpecError
    from mlx_paged.kernels.paged_attention_geometry import define

    # Besides the decode kernels: the quantized pages' write kernel, the recurrence, MLA and the
    # fused lean step's layer kernels.
    kinds = [(("latent_",), latent_attention.LatentSpec, latent_attention.define),
             (("quantize_rows_",), quantize_rows.QuantizeRowsSpec, quantize_rows.define),
             (("gated_delta_",), gated_delta.GatedDeltaSpec, gated_delta.define),
             (tuple(f"{k}_" for k in layer_kernels.KINDS), layer_kernels.LayerKernelSpec,
              layer_kernels.define)]  # fmt: skip
    try:
        kind = next((k for k in kinds if args.spec.startswith(k[0])), ((), KernelSpec, define))
        spec, make = kind[1].parse(args.spec), kind[2]
        if args.backend:
            spec = dataclasses.replace(spec, backend=args.backend)
        defn = make(spec)
    except (UnsupportedSpecError, KernelRenderError) as exc:
        print(f"mlx-paged kernels render: {exc}", file=sys.stderr)
        return 2
    geometry = defn.notes.get("geometry")
    print(
        f"// {spec.name}: inputs {', '.join(defn.input_names)}; outputs "
        f"{', '.join(defn.output_names)}; {defn.threads_per_threadgroup} threads/threadgroup, "
        f"{defn.threadgroup_bytes} B threadgroup memory"
        + (f" + {defn.ring_bytes} B ring" if defn.ring_bytes else "")
        + (f"; {geometry}" if geometry else ""),
        file=sys.stderr,
    )
    if (args.full or args.check) and spec.backend == "cuda":
        return _render_cuda(defn, args.check)
    if args.full or args.check:
        return _render_metal(spec, args.check)
    if defn.header:
        print("// ---- header ----")
        print(defn.header)
        print("// ---- body ----")
    print(defn.source, end="")
    return 0


def _render_metal(spec, check: bool) -> int:
    """The complete MSL MLX generates; with `check`, clang's verdict."""
    from mlx_paged.codegen.metal_check import MetalCheckError, check_metal_source
    from mlx_paged.kernels.metal_capture import capture_metal_source

    source = capture_metal_source(spec)
    print(source, end="")
    if check:
        try:
            check_metal_source(source, spec.name)
        except MetalCheckError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"// {spec.name}: clang compile check passed", file=sys.stderr)
    return 0


def _render_cuda(defn, check: bool) -> int:
    """The CUDA translation unit MLX would compile; with `check`, NVRTC's verdict."""
    from mlx_paged.codegen.cuda_check import CudaCheckError, check_cuda_source, wrap

    print(wrap(defn), end="")
    if not check:
        return 0
    try:
        report = check_cuda_source(defn)
    except CudaCheckError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"// {defn.name}: NVRTC compile check passed ({report.registers} registers, "
        f"{report.spill_bytes} B spilled, {report.shared_bytes} B static shared memory)",
        file=sys.stderr,
    )
    return 0
