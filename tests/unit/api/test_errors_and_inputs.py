"""The API's pure parts without a model: error mapping, input forms, message conversion, settings."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from litestar.exceptions import ClientException, ValidationException

from homeai.api.errors import BadRequest, error_body, to_api_error
from homeai.api.openai_chat import message_dicts, sampling_params
from homeai.api.openai_routes import embedding_inputs
from homeai.api.openai_schemas import ChatCompletionRequest, ResponsesRequest
from homeai.api.responses_routes import input_messages
from homeai.api.settings import DEFAULT_POLICY, POLICY_FILE_NAME, Settings, default_data_dir
from homeai.engine.embed_service import QueueTimeoutError
from homeai.engine.llm_engine import RequestError
from homeai.gateway.gateway import UnknownModelError
from homeai.scheduling.class_queue import QueueFullError


def test_engine_errors_map_to_statuses() -> None:
    full = to_api_error(QueueFullError(2.2, "voice"))
    assert full.status_code == 429 and full.headers == {"Retry-After": "3"} and full.code == "queue_full"
    timeout = to_api_error(QueueTimeoutError("queue timeout"))
    assert timeout.status_code == 503 and "Retry-After" in timeout.headers
    missing = to_api_error(UnknownModelError("model 'x' not found"))
    assert (missing.status_code, missing.param, missing.message) == (404, "model", "model 'x' not found")
    assert to_api_error(RequestError("prompt has 3000 tokens")).status_code == 400
    assert to_api_error(PermissionError("no")).status_code == 403
    assert to_api_error(ClientException("too big", status_code=413)).status_code == 413
    assert to_api_error(ZeroDivisionError()).status_code == 500


def test_validation_errors_name_the_field() -> None:
    wrong = ValidationException("Validation failed", extra=[
        {"message": "Expected `str`, got `int` - at `$.messages[0].content`", "key": "data", "source": "body"}])
    err = to_api_error(wrong)
    assert err.param == "messages[0].content" and "got `int`" in err.message and "$." not in err.message
    missing = to_api_error(ValidationException("x", extra=[{"message": "Object missing required field `model`",
                                                            "key": "data"}]))
    assert missing.param == "model"
    malformed = to_api_error(ClientException("JSON is malformed: invalid character (byte 5)"))
    assert malformed.status_code == 400 and malformed.message.startswith("malformed JSON body")


def test_error_shape_follows_the_api_family() -> None:
    err = BadRequest("bad n", param="n")
    assert error_body(err, "/api/chat") == {"error": "bad n"}
    assert error_body(err, "/v1/chat/completions") == {"error": {
        "message": "bad n", "type": "invalid_request_error", "param": "n", "code": None}}


def test_embedding_input_forms() -> None:
    assert embedding_inputs("a") == ["a"]
    assert embedding_inputs(["a", "b"]) == ["a", "b"]
    assert embedding_inputs([1, 2, 3]) == [[1, 2, 3]]
    assert embedding_inputs([[1, 2], [3]]) == [[1, 2], [3]]
    for bad in ([], ["a", 1], [[1], []], [True, False], [{"a": 1}]):
        with pytest.raises(BadRequest) as err:
            embedding_inputs(bad)
        assert err.value.param == "input"


def test_chat_messages_and_sampling_defaults() -> None:
    data = msgspec.json.decode(b'{"model": "m", "messages": [{"role": "developer", "content": "be brief"},'
                               b'{"role": "user", "content": [{"type": "text", "text": "hi "},'
                               b'{"type": "text", "text": "there"}]}, {"role": "assistant", "content": null},'
                               b'{"role": "tool", "content": "42"}], "stop": "x"}', type=ChatCompletionRequest)
    assert message_dicts(data.messages) == [{"role": "system", "content": "be brief"},
                                            {"role": "user", "content": "hi there"},
                                            {"role": "assistant", "content": ""},
                                            {"role": "user", "content": "<tool_response>\n42\n</tool_response>"}]
    params = sampling_params(data)
    assert (params.temperature, params.top_p, params.stop) == (1.0, 1.0, ["x"])
    image = msgspec.json.decode(b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
                                type=ChatCompletionRequest)
    with pytest.raises(BadRequest) as err:
        message_dicts(image.messages)
    assert err.value.param == "messages[0].content[0]"


def test_responses_input_items() -> None:
    data = ResponsesRequest(model="m", instructions="be brief", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "turn on the light"}]},
        {"type": "function_call", "name": "HassTurnOn", "arguments": "{}", "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
        {"type": "reasoning", "summary": []}])
    roles = [m["role"] for m in input_messages(data)]
    assert roles == ["system", "user", "assistant", "user"]
    with pytest.raises(BadRequest):
        input_messages(ResponsesRequest(model="m", input=[{"role": "assistant", "content": "hi"}]))


def test_settings_data_dir_and_first_start_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOMEAI_DATA_DIR", str(tmp_path / "env"))
    assert default_data_dir() == tmp_path / "env"
    settings = Settings(data_dir=tmp_path / "data")
    path = settings.prepare_data_dir()
    assert path == tmp_path / "data" / POLICY_FILE_NAME and path.read_text() == DEFAULT_POLICY.read_text()
    path.write_text("# edited\n" + path.read_text())
    assert settings.prepare_data_dir().read_text().startswith("# edited")  # never overwritten
    explicit = Settings(data_dir=tmp_path / "d2", policy_path=tmp_path / "mine.yaml")
    assert explicit.prepare_data_dir() == tmp_path / "mine.yaml" and not (tmp_path / "d2" / POLICY_FILE_NAME).exists()
    assert not Settings().requires_keys and Settings(host="0.0.0.0").requires_keys


def test_a_request_its_class_retired_before_it_ran_is_a_503_counted_as_rejected() -> None:
    """A queued request whose class a policy change removed reached its client as a 500 engine error and was
    counted as an error; sent again, the new policy routes it."""
    from homeai.api.errors import to_api_error
    from homeai.engine.errors import ClassRetiredError
    from homeai.gateway.metering import outcome_of

    retired = ClassRetiredError("class 'voice' was removed by a policy change; send the request again")
    answer = to_api_error(retired)
    assert (answer.status_code, answer.code, answer.headers.get("Retry-After")) == (503, "class_removed", "1")
    assert outcome_of(retired) == "rejected"
