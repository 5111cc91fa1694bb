"""The Benchmark tab: the methods on a slice of a dataset (a bundled suite, a preset, a Hub
dataset or an uploaded file), with the model and every setting of the Run tab; its job has
``api_name="benchmark"``."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.benchmarks.problems import BUNDLED_SETS, TASKS
from engine.benchmarks.problems import PRESETS as DATASET_PRESETS
from engine.config import RunConfig
from ssr_ui.benchmark import BENCH_METHODS, RUN_COLUMNS
from ssr_ui.benchmark import MAX_ROWS as BENCH_MAX_ROWS
from ssr_ui.handlers import Studio
from ssr_ui.tabs.common import PRIVATE, as_sent
from ssr_ui.tabs.endpoints import api_signature, busy, job_of, model_jobs, stopper
from ssr_ui.tabs.settings import MODEL_NAMES


@dataclass
class BenchmarkTab:
    """The Benchmark tab's inputs (in the API's order), its buttons and its outputs."""

    inputs: dict[str, gr.Component]  # dataset, upload, methods, limit, repeat, sample_seed, task, question/answer field
    run_btn: gr.Button
    stop_btn: gr.Button
    outputs: list[gr.Component]  # status, summary, runs, accuracy, latency, tokens, acceptance, early exit

    @property
    def status(self) -> gr.HTML:
        return self.outputs[0]


def intro(studio: Studio) -> str:
    """What the tab does (and, on a shared studio, its bounds)."""
    bounds = (f" On this shared studio a benchmark is at most {studio.public.max_benchmark_runs} runs "
              "(problems x repeats x methods), and it takes turns for the model: between two of its "
              "runs, other visitors' runs waiting go first.") if studio.public.on else ""
    return ("Run the methods on a slice of a dataset, one problem after another (baseline first, after "
            "an untimed warm-up), with the model and every setting of the Run tab; answers are graded "
            "by task (math: math-verify; choice: the option letter; code and free text: agreement with "
            "baseline) and every run is logged under the dataset's name. `python -m engine.tools.bench "
            "--dataset ...` runs the same loop from a terminal." + bounds)


def build(studio: Studio) -> BenchmarkTab:
    """The Benchmark tab, in the page's order (inside the caller's Blocks)."""
    with gr.Tab("Benchmark"):
        gr.Markdown(intro(studio))
        with gr.Row():
            with gr.Column(scale=3):
                upload = gr.File(label="Problems file (.jsonl, .json, .csv, .parquet; up to 20 MB)",
                                 file_types=[".jsonl", ".json", ".csv", ".parquet"], type="filepath",
                                 elem_id="bench-upload")
                dataset = gr.Textbox(label="…or a dataset", max_lines=1, elem_id="bench-dataset",
                                     placeholder="bundled-arithmetic, gsm8k, HuggingFaceH4/MATH-500:test",
                                     info=f"{' / '.join(BUNDLED_SETS)} (bundled), a preset ({', '.join(DATASET_PRESETS)}) "
                                          "or NAME[:CONFIG][:SPLIT] from the Hub (streams only the rows it reads)")
                gr.Examples([[name] for name in BUNDLED_SETS], inputs=[dataset], label="Bundled suites")
            with gr.Column(scale=2):
                inputs = {"dataset": dataset, "upload": upload, **_options()}
                with gr.Row():
                    run_btn = gr.Button("Run benchmark", variant="primary", elem_id="bench-run")
                    stop_btn = gr.Button("Stop", variant="stop", interactive=False, elem_id="bench-stop")
        outputs = _results()
    return BenchmarkTab(inputs, run_btn, stop_btn, outputs)


def _options() -> dict[str, gr.Component]:
    """The methods, problems, repeats, sample seed, task and fields: by the API's parameter names."""
    methods = gr.CheckboxGroup(list(BENCH_METHODS), value=["baseline", "ssr"], label="Methods",
                               info="target: RSD's target alone (RSD's ratios are to it); "
                                    "ssr-exit: SSR early exit (lossy), graded like the others")
    with gr.Row():
        limit = as_sent(gr.Number(value=10, precision=0, label="Problems", info=f"the first N (1..{BENCH_MAX_ROWS})"))
        repeat = as_sent(gr.Number(value=1, precision=0, label="Repeats", info="per problem"))
        sample = gr.Textbox(value="", label="Sample seed", max_lines=1,
                            info="blank: the first rows; a number: a random sample")
    with gr.Row():
        task = gr.Dropdown(["auto", *TASKS], value="auto", label="Task",
                           info="auto: the preset's, the row's suite, math with a reference")
        qfield = gr.Textbox(label="Question field", max_lines=1, placeholder="auto")
        afield = gr.Textbox(label="Answer field", max_lines=1, placeholder="auto")
    return dict(methods=methods, limit=limit, repeat=repeat, sample_seed=sample, task=task, question_field=qfield,
                answer_field=afield)


def _results() -> list[gr.Component]:
    """The status, the tables and the charts, in the benchmark's output order."""
    status = gr.HTML('<div class="metrics status">ready</div>', label="benchmark status", elem_id="bench-status")
    summary = gr.Dataframe(headers=["method"], interactive=False, wrap=False, label="results by method",
                           elem_id="bench-summary")
    with gr.Row(equal_height=False):  # each chart keeps a readable width: on a phone they stack
        with gr.Column(min_width=360):
            accuracy = gr.Plot(label="accuracy", show_label=False)
        with gr.Column(min_width=360):
            latency = gr.Plot(label="latency", show_label=False)
        with gr.Column(min_width=360):
            tokens = gr.Plot(label="answer tokens", show_label=False)
    acceptance = gr.Plot(label="acceptance", show_label=False)
    early_exit = gr.Plot(label="early exit by k", show_label=False)
    runs = gr.Dataframe(headers=RUN_COLUMNS, interactive=False, wrap=False, label="runs", elem_id="bench-runs")
    return [status, summary, runs, accuracy, latency, tokens, acceptance, early_exit]


def bench_outputs(frame) -> tuple:
    """A benchmark's frame as its outputs: what the frame leaves unchanged stays as drawn."""
    return tuple(gr.update() if keep else value for value, keep in zip(frame.as_tuple(), frame.unchanged, strict=True))


def wire(studio: Studio, cfg: RunConfig, tab: BenchmarkTab, model: gr.Dropdown, settings: dict, buttons: list, gpu):
    """Run benchmark pressed: the benchmark (``api_name="benchmark"``, wrapped by ``gpu``) with the
    Run tab's ``model`` and ``settings``; Stop. Returns the benchmark's event."""
    @gpu
    @api_signature(cfg, settings, MODEL_NAMES)
    def benchmark(request: gr.Request, dataset: str = "", upload: str | None = None, methods=("baseline", "ssr"),
                  limit=10, repeat=1, sample_seed="", task="auto", question_field="", answer_field="",
                  model: str = "", **settings):
        roles = {name: settings.pop(name) for name in MODEL_NAMES}
        with job_of(studio, request) as job:
            if job is None:
                return
            for frame in studio.benchmark(dataset, upload, methods, limit, repeat, sample_seed, question_field,
                                          answer_field, task, model, roles["draft_model"], roles["prm"], job=job,
                                          **settings):
                yield bench_outputs(frame)

    bench_event = tab.run_btn.click(busy, None, buttons, queue=False, **PRIVATE).then(
        benchmark, [*tab.inputs.values(), model, *settings.values()], tab.outputs, api_name="benchmark",
        **model_jobs(studio), show_progress="minimal", show_progress_on=[tab.status])
    tab.stop_btn.click(stopper(studio), None, None, queue=False, **PRIVATE)
    return bench_event

