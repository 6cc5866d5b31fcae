// lltm-generate-cpp MODEL.pt2 [--prompt TEXT] [--length N] [--temperature T] [--top-k K] [--seed S]
//
// Samples text from a character model exported with `lltm-export CKPT MODEL.pt2` (the default format, aoti: a
// torch.export program compiled by AOTInductor into a package, loaded here by torch::inductor::
// AOTIModelPackageLoader), exactly as lltm-generate (lltm_train/inference.py: sample) does in Python: the prompt
// is read once, then one token a step with the state carried; each token is drawn by torch::multinomial from
// softmax((logits - max) / T) (restricted to the K likeliest with --top-k) with a CPU generator seeded with S, so
// the same seed gives the same text token for token. The vocabulary and the state's size come from the
// package's metadata vocab.json and config.json ("states": 2 for (h, c) cells, the LLTM and the LSTM; 1 for
// the GRU and the RNN, whose state is h alone; 4 for the sLSTM's (h, c, n, m), whose zero state is its start). The package must be compiled for the CPU (lltm-export
// --device cpu, the default). The model calls the op library's ops (lltm::*) through the dispatcher: the
// program links liblltm_ops.so, whose static registrations make them known (CMakeLists.txt).
//
// A file that is not a .pt2 is taken as a TorchScript file (lltm-export --format torchscript, deprecated with
// torch.jit since torch 2.13), with the same two files as its extra files.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// Appends code point cp to out as UTF-8.
void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The strings of a JSON array of strings (what Python's json.dumps writes for the vocabulary).
std::vector<std::string> parse_string_array(const std::string& json) {
  std::vector<std::string> items;
  size_t i = json.find('[');
  if (i == std::string::npos) throw std::runtime_error("vocab.json: not a JSON array");
  for (++i; i < json.size(); ++i) {
    char ch = json[i];
    if (ch == ']') return items;
    if (ch != '"') continue;
    std::string s;
    for (++i; i < json.size() && json[i] != '"'; ++i) {
      if (json[i] != '\\') {
        s += json[i];
        continue;
      }
      char e = json[++i];
      switch (e) {
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        case 'r': s += '\r'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'u': {
          uint32_t cp = std::stoul(json.substr(i + 1, 4), nullptr, 16);
          i += 4;
          if (cp >= 0xD800 && cp < 0xDC00 && json.compare(i + 1, 2, "\\u") == 0) {  // a surrogate pair
            uint32_t low = std::stoul(json.substr(i + 3, 4), nullptr, 16);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            i += 6;
          }
          append_utf8(s, cp);
          break;
        }
        default: s += e;  // \" \\ \/
      }
    }
    items.push_back(s);
  }
  throw std::runtime_error("vocab.json: unterminated array");
}

// The integer value of "key" in a flat JSON object.
int64_t json_int(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\"");
  if (at == std::string::npos) throw std::runtime_error("config.json: no " + key);
  return std::stoll(json.substr(json.find(':', at) + 1));
}

// The UTF-8 characters of text.
std::vector<std::string> characters(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    unsigned char c = text[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

// A model file opened: its forward (tokens, *state) -> (logits, *state), and its vocab.json and config.json.
struct Model {
  std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)> forward;
  std::string vocab_json, config_json;
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Opens path: an AOTInductor package (.pt2), or else a TorchScript file. std::runtime_error if it cannot.
Model load_model(const std::string& path) {
  Model model;
  if (ends_with(path, ".pt2")) {
    auto loader = std::make_shared<torch::inductor::AOTIModelPackageLoader>(path);
    std::unordered_map<std::string, std::string> meta = loader->get_metadata();
    auto device = meta.find("AOTI_DEVICE_KEY");
    if (device != meta.end() && device->second != "cpu") {
      throw std::runtime_error("the package is compiled for " + device->second +
                               "; this program runs on the CPU: export with lltm-export --device cpu");
    }
    if (!meta.count("vocab.json") || !meta.count("config.json")) {
      throw std::runtime_error("the package has no vocab.json and config.json in its metadata: export it with lltm-export");
    }
    model.vocab_json = meta["vocab.json"];
    model.config_json = meta["config.json"];
    model.forward = [loader](const std::vector<torch::Tensor>& inputs) { return loader->run(inputs); };
    return model;
  }
  torch::jit::ExtraFilesMap extra{{"vocab.json", ""}, {"config.json", ""}};
  auto module = std::make_shared<torch::jit::Module>(torch::jit::load(path, torch::kCPU, extra));
  module->eval();
  model.vocab_json = extra["vocab.json"];
  model.config_json = extra["config.json"];
  model.forward = [module](const std::vector<torch::Tensor>& inputs) {
    auto out = module->forward(std::vector<torch::jit::IValue>(inputs.begin(), inputs.end())).toTuple();
    std::vector<torch::Tensor> results;
    for (const auto& value : out->elements()) results.push_back(value.toTensor());
    return results;
  };
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cerr << "usage: lltm-generate-cpp MODEL.pt2 [--prompt TEXT] [--length N] [--temperature T] [--top-k K] "
                 "[--seed S]\n";
    return argc < 2 ? 2 : 0;
  }
  std::map<std::string, std::string> opt{{"--prompt", "\n"}, {"--length", "500"}, {"--temperature", "0.8"},
                                         {"--top-k", "0"}, {"--seed", "0"}};
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!opt.count(argv[i])) {
      std::cerr << "lltm-generate-cpp: error: unknown option " << argv[i] << "\n";
      return 2;
    }
    opt[argv[i]] = argv[i + 1];
  }
  const int64_t length = std::stoll(opt["--length"]), top_k = std::stoll(opt["--top-k"]);
  const double temperature = std::stod(opt["--temperature"]);
  if (!(temperature > 0) || length < 0 || top_k < 0) {
    std::cerr << "lltm-generate-cpp: error: need --temperature > 0, --length >= 0, --top-k >= 0\n";
    return 2;
  }
  Model model;
  try {
    model = load_model(argv[1]);
  } catch (const std::exception& e) {  // one line: the first of the message (libtorch's go on with details)
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::string message = c10_error ? c10_error->what_without_backtrace() : e.what();
    message = message.substr(0, message.find('\n'));
    std::cerr << "lltm-generate-cpp: error: cannot load " << argv[1] << ": " << message
              << (c10_error && ends_with(argv[1], ".pt2") ? " (an AOTInductor package from lltm-export --format aoti, the default, "
                                               "on the CPU?)" : "") << "\n";
    return 2;
  }
  const std::vector<std::string> vocab = parse_string_array(model.vocab_json);
  const int64_t layers = json_int(model.config_json, "num_layers");
  const int64_t hidden = json_int(model.config_json, "hidden_size");
  // TorchScript files exported before the GRU existed have no "states": they are (h, c) models
  const int64_t states = model.config_json.find("\"states\"") == std::string::npos ? 2 : json_int(model.config_json, "states");
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < vocab.size(); ++i) index[vocab[i]] = static_cast<int64_t>(i);

  std::vector<int64_t> prompt;
  std::string unknown;
  for (const auto& ch : characters(opt["--prompt"])) {
    auto it = index.find(ch);
    if (it == index.end()) unknown += (unknown.empty() ? "'" : ", '") + ch + "'";
    else prompt.push_back(it->second);
  }
  if (!unknown.empty() || prompt.empty()) {
    std::cerr << "lltm-generate-cpp: error: " << (prompt.empty() && unknown.empty() ? "the prompt is empty" :
                 "the prompt has characters the model never saw: " + unknown) << "\n";
    return 2;
  }

  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(std::stoull(opt["--seed"])));
  std::vector<torch::Tensor> state(states, torch::zeros({layers, 1, hidden}));  // (h, c), (h) or (h, c, n, m)
  auto step = [&](const torch::Tensor& tokens) {
    std::vector<torch::Tensor> inputs{tokens};
    inputs.insert(inputs.end(), state.begin(), state.end());
    std::vector<torch::Tensor> out = model.forward(inputs);  // (logits, *state)
    for (int64_t i = 0; i < states; ++i) state[i] = out[1 + i];
    return out[0];  // (T, 1, V)
  };
  auto logits = step(torch::tensor(prompt, torch::kLong).unsqueeze(1));
  std::string text = opt["--prompt"];
  for (int64_t n = 0; n < length; ++n) {
    auto last = logits[-1][0].to(torch::kDouble);
    last = (last - last.max()) / temperature;  // as lltm-generate: a tiny temperature is greedy, not NaN
    if (top_k > 0 && top_k < last.numel()) {
      auto cutoff = std::get<0>(torch::topk(last, top_k))[-1];
      last = last.masked_fill(last < cutoff, -std::numeric_limits<float>::infinity());
    }
    const int64_t token = torch::multinomial(torch::softmax(last, -1), 1, false, generator).item<int64_t>();
    text += vocab[token];
    logits = step(torch::tensor({token}, torch::kLong).view({1, 1}));
  }
  std::cout << text << "\n";
  return 0;
}
