"""The PyTorch port the benchmarks time ours against: transformers' BertModel + a GlobalPointer head as the public
ports write it (GlobalPointer_pytorch: dense logits, 1e12 masks, sinusoidal RoPE) and their dense multi-label ZLPR
loss, on CUDA when there is a GPU. `benchmarks.train_step` and device_check's stage train_step time its train step,
`benchmarks.serving` its forward."""

from __future__ import annotations

import numpy as np

# Deferred imports below: torch and transformers (optional, slow to import) inside each function.


def torch_global_pointer(hf: dict, pretrained, *, num_types: int, head_size: int):
  """-> (model, device): the encoder from `pretrained` (a folder) or random-init `BertModel(BertConfig(**hf))`,
  seeded, on the device; train mode (call .eval() for inference)."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top
  from transformers import BertConfig, BertModel  # pylint: disable=g-import-not-at-top

  dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")

  class GlobalPointer(nn.Module):
    """As in the public ports (e.g. GlobalPointer_pytorch): dense logits, 1e12 masks, sinusoidal RoPE."""

    def __init__(self, encoder, ent_type_size, inner_dim):
      super().__init__()
      self.encoder = encoder
      self.ent_type_size, self.inner_dim = ent_type_size, inner_dim
      self.dense = nn.Linear(encoder.config.hidden_size, ent_type_size * inner_dim * 2)

    def sinusoidal_position_embedding(self, batch_size, seq_len, output_dim):
      position_ids = torch.arange(0, seq_len, dtype=torch.float, device=dev).unsqueeze(-1)
      indices = torch.arange(0, output_dim // 2, dtype=torch.float, device=dev)
      indices = torch.pow(10000, -2 * indices / output_dim)
      embeddings = position_ids * indices
      embeddings = torch.stack([torch.sin(embeddings), torch.cos(embeddings)], dim=-1)
      embeddings = embeddings.repeat((batch_size, *([1] * len(embeddings.shape))))
      return torch.reshape(embeddings, (batch_size, seq_len, output_dim))

    def forward(self, input_ids, attention_mask, token_type_ids):
      last_hidden_state = self.encoder(input_ids, attention_mask, token_type_ids)[0]
      batch_size, seq_len = last_hidden_state.shape[:2]
      outputs = self.dense(last_hidden_state)
      outputs = torch.split(outputs, self.inner_dim * 2, dim=-1)
      outputs = torch.stack(outputs, dim=-2)
      qw, kw = outputs[..., :self.inner_dim], outputs[..., self.inner_dim:]
      pos_emb = self.sinusoidal_position_embedding(batch_size, seq_len, self.inner_dim)
      cos_pos = pos_emb[..., None, 1::2].repeat_interleave(2, dim=-1)
      sin_pos = pos_emb[..., None, ::2].repeat_interleave(2, dim=-1)
      qw2 = torch.stack([-qw[..., 1::2], qw[..., ::2]], -1).reshape(qw.shape)
      qw = qw * cos_pos + qw2 * sin_pos
      kw2 = torch.stack([-kw[..., 1::2], kw[..., ::2]], -1).reshape(kw.shape)
      kw = kw * cos_pos + kw2 * sin_pos
      logits = torch.einsum("bmhd,bnhd->bhmn", qw, kw)
      pad_mask = attention_mask.unsqueeze(1).unsqueeze(1).expand(batch_size, self.ent_type_size, seq_len, seq_len)
      logits = logits * pad_mask - (1 - pad_mask) * 1e12
      mask = torch.tril(torch.ones_like(logits), -1)
      logits = logits - mask * 1e12
      return logits / self.inner_dim ** 0.5

  torch.manual_seed(0)
  encoder = BertModel.from_pretrained(str(pretrained)) if pretrained else BertModel(BertConfig(**hf))
  return GlobalPointer(encoder, num_types, head_size).to(dev), dev


def torch_zlpr(y_pred, y_true):
  """The ports' dense ZLPR over [N, C] logits and {0, 1} labels."""
  import torch  # pylint: disable=g-import-not-at-top

  y_pred = (1 - 2 * y_true) * y_pred
  y_pred_neg = y_pred - y_true * 1e12
  y_pred_pos = y_pred - (1 - y_true) * 1e12
  zeros = torch.zeros_like(y_pred[..., :1])
  y_pred_neg = torch.cat([y_pred_neg, zeros], dim=-1)
  y_pred_pos = torch.cat([y_pred_pos, zeros], dim=-1)
  return (torch.logsumexp(y_pred_neg, dim=-1) + torch.logsumexp(y_pred_pos, dim=-1)).mean()


def make_torch_step(hf: dict, pretrained, *, batch: dict, num_types: int, head_size: int, compiled: bool = False,
                    lr: float = 2e-5, autocast: bool = False, attention_dropout: float | None = None):
  """-> (a closure running one train step of the public-port PyTorch model on `batch` (numpy), attention impl).

  The encoder is `pretrained` (a dir) or a random-init `BertModel(BertConfig(**hf))`; `compiled`: forward + loss
  under `torch.compile` (compiled on the first call); `autocast`: the forward under `torch.autocast(bfloat16)`, the
  loss on float32 logits; `attention_dropout`: the encoder's attention-probability dropout (None: its config's)."""
  import torch  # pylint: disable=g-import-not-at-top

  model, dev = torch_global_pointer(hf, pretrained, num_types=num_types, head_size=head_size)
  if attention_dropout is not None:
    for m in model.encoder.modules():
      if type(m).__name__.endswith("SelfAttention") and isinstance(getattr(m, "dropout", None), torch.nn.Dropout):
        m.dropout.p = attention_dropout
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=lr)
  ids = torch.from_numpy(batch["features"]["input_ids"]).long().to(dev)
  types = torch.from_numpy(batch["features"]["token_type_ids"]).long().to(dev)
  mask = torch.from_numpy(batch["attention_mask"]).long().to(dev)
  B, H, L = batch["span_ids"].shape
  labels = np.zeros((B, H, L * L), np.float32)  # the ports' dense labels, built in the collate function
  b_, h_, k_ = np.nonzero(batch["span_ids"] >= 0)
  labels[b_, h_, batch["span_ids"][b_, h_, k_]] = 1
  labels_t = torch.from_numpy(labels).to(dev)

  def loss_fn():
    if autocast:
      with torch.autocast(dev.type, dtype=torch.bfloat16):
        logits = model(ids, mask, types)
      logits = logits.float()
    else:
      logits = model(ids, mask, types)
    return torch_zlpr(logits.reshape(B * H, -1), labels_t.reshape(B * H, -1))

  if compiled:
    loss_fn = torch.compile(loss_fn)

  def step():
    loss = loss_fn()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()

  return step, getattr(model.encoder.config, "_attn_implementation", "?")
