import anthropic
import psycopg

from tests.fake_anthropic import ErrorStep, text_message


def test_database_has_record_tables(database_url):
    with psycopg.connect(database_url) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema='public'")}
    assert {"sessions", "messages", "schema_migrations"} <= tables


async def test_dev_server_answers(client):
    assert (await client.service_client.check_health()) is True


def test_fake_server_speaks_messages_api(fake_anthropic):
    fake_anthropic.push(ErrorStep(529, "overloaded_error"), text_message("hi"))
    sdk = anthropic.Anthropic(base_url=fake_anthropic.base_url, api_key="k", max_retries=0)
    try:
        sdk.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("529 should raise")
    except anthropic.APIStatusError as err:
        assert err.status_code == 529
    reply = sdk.messages.create(model="m", max_tokens=5,
                                messages=[{"role": "user", "content": "x"}])
    assert reply.content[0].text == "hi"
    assert len(fake_anthropic.requests) == 2
