"""Reads a run's TensorBoard event files with TensorBoard's own EventAccumulator and
checks the tags and values normrl writes. Usage: check_tensorboard.py RUN_DIR [--raw]
(--raw: keep orphaned events, as a reader that ignores restart markers would).
Prints one JSON object with every scalar tag's (step, value) pairs, the text tags, the
hparams plugin's data, decoded with TensorBoard's own protos, and every image tag's
(step, width, height, encoded image in hex)."""
import json
import sys

from google.protobuf import json_format
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

run = sys.argv[1]
raw = "--raw" in sys.argv[2:]
acc = EventAccumulator(
    run,
    size_guidance={"scalars": 0, "tensors": 0, "images": 0},
    purge_orphaned_data=not raw,
)
acc.Reload()
tags = acc.Tags()
out = {"scalars": {}, "tensors": {}, "hparams": {}, "images": {}}
for tag in tags["scalars"]:
    out["scalars"][tag] = [[e.step, e.value] for e in acc.Scalars(tag)]
for tag in tags.get("images", []):
    out["images"][tag] = [
        [e.step, e.width, e.height, e.encoded_image_string.hex()] for e in acc.Images(tag)
    ]
hparams_tags = set()
try:
    for tag, content in acc.PluginTagToContent("hparams").items():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        out["hparams"][tag] = json_format.MessageToDict(data)
        hparams_tags.add(tag)
except KeyError:
    pass
for tag in tags.get("tensors", []):
    if tag not in hparams_tags:
        out["tensors"][tag] = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(tag)]
print(json.dumps(out))
